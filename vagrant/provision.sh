#!/usr/bin/env bash
# labkit provisioning: makes a Debian 12 (or Ubuntu 22.04+) machine ready for
# the labkit lab -- inside the Vagrant VM (vagrant/Vagrantfile runs it) or on
# a bare host.  Run as root.  Idempotent: a second run with nothing to do
# calls neither apt nor pip and finishes in a few seconds.
#
#   sudo bash vagrant/provision.sh                    # lab + notebooks
#   sudo bash vagrant/provision.sh --dev              # + test tools (make test)
#   sudo bash vagrant/provision.sh --jupyter-service  # + JupyterLab as a service
#   sudo bash vagrant/provision.sh --print-url        # print the JupyterLab URL
#
# Every step prints one line:  labkit-provision: <step>: ok|done|skipped (reason)
#
# labkitd (labkit/door/), the root service every lab's privileged acts go through, is
# installed as the systemd unit labkitd (vagrant/labkitd.service) and kept running where
# systemd runs; elsewhere start it with: sudo labkit daemon start.
#
# Environment:
#   LABKIT_VENV        venv location (default /opt/labkit/venv)
#   LABKIT_JUPYTER_IP  address the JupyterLab service binds (default 127.0.0.1;
#                      the Vagrantfile sets 0.0.0.0 under VirtualBox, see there why)
#   LABKIT_WORKDIR     the learner's work folder JupyterLab serves, made and kept
#                      in step by `labkit work sync` (the Vagrantfile sets
#                      /home/vagrant/work; unset: JupyterLab serves labs/)
#   LABKIT_WORK_USER   who owns the work folder (the Vagrantfile: vagrant): the learner.
#                      The JupyterLab service runs as them (root when unset), and the
#                      answer keys in instructor/ are kept from them
#   LABKIT_DEV_OPTIONAL=0  --dev without the optional vagrant and chromium (the
#                      browser tests and nested VMs need them; vagrant/arm64-test.sh
#                      runs neither)
#
# A failure with a known cause (no network, no kernel headers, a full disk)
# ends with one line saying what to do; `labkit doctor` repeats it.
set -euo pipefail

PROG=labkit-provision
DEV=0
QUIET=0
JUPYTER_SERVICE=0
PRINT_URL=0
IMAGE=0
ORIG_ARGS="$*"

usage() {
    cat <<EOF
usage: $0 [--dev] [--quiet] [--jupyter-service] [--print-url] [--image]

  --dev              also install test tools (pytest extras, clang, llvm,
                     vagrant and chromium when apt has them)
  --quiet            send apt/pip output to $PROG's log (/var/log/labkit-provision.log);
                     the one-line step reports are still printed
  --jupyter-service  run JupyterLab as the systemd service labkit-jupyter
  --print-url        only print the JupyterLab URL (with its token) and exit
  --image            install into a box's root file system (make box, run in a chroot by
                     vagrant/build-box.sh): the headers are the box kernel's (LABKIT_KREL),
                     and what belongs to a running machine (bpffs, the service) is left to
                     the VM's own provisioning, which then needs no network
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --dev) DEV=1 ;;
        --quiet) QUIET=1 ;;
        --jupyter-service) JUPYTER_SERVICE=1 ;;
        --print-url) PRINT_URL=1 ;;
        --image) IMAGE=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "$PROG: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${LABKIT_VENV:-/opt/labkit/venv}"
SYS_PY=/usr/bin/python3
KREL="$(uname -r)"
if [ "$IMAGE" = 1 ]; then
    # In a chroot uname names the building host's kernel, not the one the box will boot.
    KREL="${LABKIT_KREL:?--image needs LABKIT_KREL, the kernel release the box boots}"
    [ "$JUPYTER_SERVICE" = 0 ] || { echo "$PROG: --image and --jupyter-service do not go together: the service belongs to the VM" >&2; exit 2; }
fi
LOG=/var/log/labkit-provision.log
TOKEN_DIR=/etc/labkit
TOKEN_FILE=$TOKEN_DIR/jupyter-token
JUPYTER_ENV_FILE=$TOKEN_DIR/jupyter.env
UNIT_NAME=labkit-jupyter
UNIT_FILE=/etc/systemd/system/$UNIT_NAME.service
JUPYTER_PORT=8888
WORKDIR="${LABKIT_WORKDIR:-}"
WORK_USER="${LABKIT_WORK_USER:-}" # the learner
LABKITD_UNIT_FILE=/etc/systemd/system/labkitd.service
#: The digest of the labkit code the running labkitd was (re)started with (source_digest).
LABKITD_STAMP=/var/lib/labkit/labkitd-source

export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_SUSPEND=1 # Ubuntu: no needrestart dialog during apt-get

# step, warn, die, die_cause (one line for a known cause), run, check_disk,
# apt_update, apt_install, apt_candidate; systemd_running, write_if_changed, service_up,
# labkitd_unit, source_digest, jupyter_unit, ensure_group, lock_answer_keys:
# shellcheck source=vagrant/provision-lib.sh
. "$REPO/vagrant/provision-lib.sh"

# ---------------------------------------------------------------- root
if [ "$(id -u)" != 0 ]; then
    die "must run as root (it installs packages and mounts bpffs): sudo bash $0${ORIG_ARGS:+ $ORIG_ARGS}"
fi

# ---------------------------------------------------------------- --print-url
read_token() {
    local t
    [ -r "$TOKEN_FILE" ] || return 1
    t="$(tr -d ' \t\r\n' <"$TOKEN_FILE")"
    [[ "$t" =~ ^[0-9a-f]{32}$ ]] || return 1
    printf '%s' "$t"
}
url_line() { printf 'JupyterLab: http://127.0.0.1:%s/lab?token=%s\n' "$JUPYTER_PORT" "$1"; }

if [ "$PRINT_URL" = 1 ]; then
    token="$(read_token)" || die "no JupyterLab token yet ($TOKEN_FILE); run: sudo bash $0 --jupyter-service"
    url_line "$token"
    exit 0
fi

step root ok

# ---------------------------------------------------------------- apt
BASE_PKGS=(python3 python3-venv python3-pip python3-bpfcc bpfcc-tools iproute2
    iperf3 iptables conntrack tcpdump ethtool curl procps util-linux kmod iputils-ping
    netcat-openbsd python3-scapy
    dnsmasq-base) # the lab zone's DNS server in ext (toFQDNs); -base: the binary only, no host service on :53
DEV_PKGS=(clang llvm
    mininet bridge-utils) # make bench's bring-up anchor: mn --switch lxbr (labkit/tools/doorbench.py)
DEV_OPTIONAL_PKGS=(vagrant chromium chromium-driver) # only when apt has them
[ "${LABKIT_DEV_OPTIONAL:-1}" = 0 ] && DEV_OPTIONAL_PKGS=()
BPFTOOL_PKGS=(bpftool "linux-tools-$KREL" linux-tools-generic) # first installable wins

# shellcheck disable=SC1091
OS_ID="$(. /etc/os-release 2>/dev/null && echo "${ID:-}")"
# shellcheck disable=SC1091
OS_LIKE="$(. /etc/os-release 2>/dev/null && echo "${ID_LIKE:-}")"

# Print those of the given packages that dpkg does not have fully installed.
missing_pkgs() {
    local p st
    declare -A have=()
    while read -r p st; do
        [[ "$st" == *" ok installed" ]] && have[$p]=1
    done < <(dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null || true)
    for p in "$@"; do
        [ -n "${have[$p]:-}" ] || echo "$p"
    done
}
pkg_installed() { [ -z "$(missing_pkgs "$1")" ]; }

apt_lists_present() { compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; }

step_apt() {
    local want=("${BASE_PKGS[@]}")
    [ "$DEV" = 1 ] && want+=("${DEV_PKGS[@]}")
    local -a missing=() opt_missing=() install=() unavailable=()
    mapfile -t missing < <(missing_pkgs "${want[@]}")

    # bpftool: Debian ships package bpftool; Ubuntu ships the binary in
    # linux-tools-common + linux-tools-$(uname -r) (or -generic).
    local have_bpftool=0 n
    n="$(missing_pkgs "${BPFTOOL_PKGS[@]}" | wc -l)"
    [ "$n" -lt "${#BPFTOOL_PKGS[@]}" ] && have_bpftool=1

    if [ "$DEV" = 1 ]; then
        mapfile -t opt_missing < <(missing_pkgs "${DEV_OPTIONAL_PKGS[@]}")
    fi

    if [ "${#missing[@]}" = 0 ] && [ "$have_bpftool" = 1 ] && [ "${#opt_missing[@]}" = 0 ]; then
        step apt "ok (all packages present)"
        return
    fi

    # A needed package is missing: refresh the lists first.
    if [ "${#missing[@]}" != 0 ] || [ "$have_bpftool" = 0 ]; then
        apt_update
    fi
    install=("${missing[@]}")

    if [ "$have_bpftool" = 0 ]; then
        local c found=""
        for c in "${BPFTOOL_PKGS[@]}"; do
            if apt_candidate "$c"; then found="$c"; break; fi
        done
        [ -n "$found" ] || die_apt "no installable bpftool package (tried: ${BPFTOOL_PKGS[*]})"
        install+=("$found")
    fi

    # Optional dev packages: installed when apt has them, skipped otherwise.
    # (Ubuntu's chromium is a snap wrapper that cannot install from apt alone.)
    local p
    for p in "${opt_missing[@]}"; do
        if [[ "$p" == chromium* ]] && { [ "$OS_ID" = ubuntu ] || [[ " $OS_LIKE " == *" ubuntu "* ]]; }; then
            unavailable+=("$p")
        elif apt_candidate "$p"; then
            install+=("$p")
        else
            unavailable+=("$p")
        fi
    done

    local note=""
    [ "${#unavailable[@]}" != 0 ] && note="; not available from apt, skipped: ${unavailable[*]}"
    if [ "${#install[@]}" = 0 ]; then
        step apt "ok (all packages present${note})"
        return
    fi
    check_disk / "$PROVISION_NEED_MIB"
    apt_install "${install[@]}" || die_apt "apt-get install failed for: ${install[*]}"
    step apt "done (installed: ${install[*]}${note})"
}
step_apt

# ---------------------------------------------------------------- kernel headers
# BCC compiles the C in bpf/ at run time against /lib/modules/$(uname -r)/build.
step_headers() {
    local mod="/lib/modules/$KREL"
    if [ -d "$mod/build/include" ]; then
        step kernel-headers "ok ($mod/build -> $(readlink -f "$mod/build"))"
        return
    fi

    apt_lists_present || apt_update
    check_disk / 256 "installing kernel headers"
    if apt_candidate "linux-headers-$KREL"; then
        apt_install "linux-headers-$KREL" || die_apt "apt-get install linux-headers-$KREL failed"
        if [ -d "$mod/build/include" ]; then
            step kernel-headers "done (installed linux-headers-$KREL)"
            return
        fi
        warn "linux-headers-$KREL installed but $mod/build/include is still missing; wiring generic headers"
    fi

    # No headers package for the running kernel (a custom or cloud kernel):
    # use the distribution's generic headers.
    local arch generic re ubuntu=0
    arch="$(dpkg --print-architecture)"
    if [ "$OS_ID" = ubuntu ] || [[ " $OS_LIKE " == *" ubuntu "* ]]; then
        ubuntu=1
        generic=linux-headers-generic
        re="^linux-headers-[0-9][^/]*-generic$"
    else
        case "$arch" in
            amd64 | arm64) ;;
            *) warn "untested architecture $arch; trying linux-headers-$arch" ;;
        esac
        generic="linux-headers-$arch"
        re="^linux-headers-[0-9][^/]*-$arch$"
    fi
    if ! pkg_installed "$generic"; then
        apt_update
        apt_candidate "$generic" || die_headers "$KREL" "${generic#linux-headers-}"
        apt_install "$generic" || die_headers "$KREL" "${generic#linux-headers-}"
    fi

    local d dir="" src
    local -a cands=()
    for d in /usr/src/linux-headers-*; do
        [ -d "$d/include" ] || continue
        [[ "${d##*/}" =~ $re ]] || continue
        [[ "${d##*/}" == *-rt-* || "${d##*/}" == *-cloud-* ]] && continue
        cands+=("${d##*/}")
    done
    [ "${#cands[@]}" != 0 ] || die "installed $generic but found no matching /usr/src/linux-headers-* directory"
    dir="/usr/src/$(printf '%s\n' "${cands[@]}" | sort -V | tail -n 1)"
    if [ "$ubuntu" = 1 ]; then
        src="$dir"
    else
        src="${dir%-"$arch"}-common"
        [ -d "$src" ] || src="$dir"
    fi

    mkdir -p "$mod"
    local l
    for l in build source; do
        if [ -e "$mod/$l" ] && [ ! -L "$mod/$l" ]; then
            die "$mod/$l exists and is not a symlink; not replacing it"
        fi
    done
    ln -sfn "$dir" "$mod/build"
    ln -sfn "$src" "$mod/source"
    [ -d "$mod/build/include" ] || die "wired $mod/build -> $dir but $mod/build/include is missing"
    step kernel-headers "done (wired generic headers ${dir##*/linux-headers-} for running kernel $KREL: no linux-headers-$KREL package exists; this is fine because labkit's tc/cgroup BPF programs use only the stable UAPI headers, not kernel-internal structures)"
}
step_headers

# ---------------------------------------------------------------- bpffs
if [ "$IMAGE" = 1 ]; then
    step bpffs "skipped (--image: the VM mounts it when it provisions)"
elif awk '$2 == "/sys/fs/bpf" && $3 == "bpf" {f = 1} END {exit !f}' /proc/mounts; then
    step bpffs "ok (/sys/fs/bpf is mounted)"
else
    mkdir -p /sys/fs/bpf 2>/dev/null || true
    mount -t bpf bpf /sys/fs/bpf || die "could not mount bpffs at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf)"
    step bpffs "done (mounted bpf at /sys/fs/bpf; labkit re-checks it at 'up')"
fi

# ---------------------------------------------------------------- venv
# Built from Debian's /usr/bin/python3 with --system-site-packages: the bcc
# module exists only as Debian's python3-bpfcc.  (PyPI's "bcc" is an
# unrelated project -- never pip install it.)
step_venv() {
    [ -x "$SYS_PY" ] || die "$SYS_PY not found (apt package python3)"
    local state=ok why=""
    if [ -f "$VENV/pyvenv.cfg" ]; then
        local want have
        want="$("$SYS_PY" -I -c 'import sys; print(sys.prefix, sys.version)')"
        have="$("$VENV/bin/python" -I -c 'import sys; print(sys.base_prefix, sys.version)' 2>/dev/null || true)"
        if [ "$want" != "$have" ]; then
            state=recreate why="its python is not $SYS_PY"
        elif ! grep -Eqi '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg"; then
            state=recreate why="it lacks --system-site-packages"
        fi
    elif [ -e "$VENV" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
        die "$VENV exists but is not a venv; move it away or set LABKIT_VENV"
    else
        state=create
    fi

    if [ "$state" != ok ]; then
        mkdir -p "$(dirname "$VENV")"
        run "$SYS_PY" -m venv --clear --system-site-packages "$VENV" ||
            die "could not create the venv $VENV (apt package python3-venv)"
    fi

    if ! "$VENV/bin/python" -I -c 'import bcc' 2>/dev/null; then
        die "'import bcc' fails in $VENV/bin/python: BCC's Python module comes only from the apt package python3-bpfcc (apt-get install python3-bpfcc); do not 'pip install bcc', that is an unrelated PyPI project"
    fi

    local pyver
    pyver="$("$VENV/bin/python" -c 'import platform; print(platform.python_version())')"
    case "$state" in
        ok) step venv "ok ($VENV, python $pyver, bcc importable)" ;;
        create) step venv "done (created $VENV from $SYS_PY $pyver with --system-site-packages; bcc importable)" ;;
        recreate) step venv "done (recreated $VENV: $why; bcc importable)" ;;
    esac
}
step_venv

# ---------------------------------------------------------------- pip install -e
# Is `import labkit` served from this checkout?  (True while labkit/ has no
# package yet: there is nothing to check then.)
labkit_resolves() {
    [ -f "$REPO/labkit/__init__.py" ] || return 0
    "$VENV/bin/python" -I -c '
import importlib.util, sys
s = importlib.util.find_spec("labkit")
sys.exit(0 if s and s.origin and s.origin.startswith(sys.argv[1] + "/") else 1)
' "$REPO" 2>/dev/null
}

step_pip() {
    [ -f "$REPO/pyproject.toml" ] || die "$REPO/pyproject.toml not found"
    local extras=notebook
    [ "$DEV" = 1 ] && extras=notebook,test
    local stamp="$VENV/.labkit-stamp" head
    head="$(printf '%s\n%s' "$REPO" "$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)")"

    # Skip when the stamp names this checkout, this pyproject.toml and (at
    # least) these extras -- so `make lab` after `make test` does not re-run
    # pip just to drop the test extra.
    if [ -f "$stamp" ]; then
        local s_head s_extras e covered=1
        s_head="$(head -n 2 "$stamp")"
        s_extras="$(sed -n 3p "$stamp")"
        for e in ${extras//,/ }; do
            [[ ",$s_extras," == *",$e,"* ]] || covered=0
        done
        if [ "$s_head" = "$head" ] && [ "$covered" = 1 ] && labkit_resolves; then
            step pip "ok (labkit[$s_extras] already installed from $REPO)"
            return
        fi
    fi

    rm -f "$stamp"
    check_disk "$(dirname "$VENV")" 768 "installing labkit's Python packages"
    local pip_out net pip_rc=0
    pip_out="$(mktemp)"
    if [ "$QUIET" = 1 ]; then
        run "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "${REPO}[${extras}]" || pip_rc=$?
        [ "$pip_rc" = 0 ] || tail -n 60 "$LOG" >"$pip_out"
    else
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "${REPO}[${extras}]" 2>&1 | tee "$pip_out" || pip_rc=$?
    fi
    net="$(apt_network_error <"$pip_out")"
    rm -f "$pip_out"
    if [ "$pip_rc" != 0 ]; then
        [ -n "$net" ] && die_cause network pip "$net"
        die "pip install -e '${REPO}[${extras}]' failed"
    fi
    if [ ! -f "$REPO/labkit/__init__.py" ]; then
        warn "$REPO/labkit/__init__.py does not exist yet: the labkit package has no modules to import"
    elif ! labkit_resolves; then
        die "pip install -e succeeded but 'import labkit' does not resolve to $REPO/labkit"
    fi
    printf '%s\n%s\n' "$head" "$extras" >"$stamp"
    step pip "done (pip install -e '${REPO}[${extras}]' into $VENV)"
}
step_pip

# ---------------------------------------------------------------- JupyterLab settings
# labkit's JupyterLab defaults, so that a notebook opened again shows its last live CT tables,
# not "Error displaying widget: model not found": widget state saved with the notebook
# (vagrant/jupyterlab-overrides.json, into the venv's overrides.json), and the server's save
# hook that keeps it when JupyterLab would drop it (vagrant/jupyter-server-labkit.json:
# labkit/notebook/widgetstate.py).  The JupyterLab of `make lab`, of the service and of the VM
# reads both; other settings in those files are kept.
LAB_OVERRIDES="$VENV/share/jupyter/lab/settings/overrides.json"
SERVER_CONFIG="$VENV/etc/jupyter/jupyter_server_config.json"
out="$("$VENV/bin/python" -I "$REPO/vagrant/lab-settings.py" "$REPO/vagrant/jupyterlab-overrides.json" "$LAB_OVERRIDES")" ||
    die "could not set labkit's JupyterLab defaults in $LAB_OVERRIDES"
step lab-settings "$out"
out="$("$VENV/bin/python" -I "$REPO/vagrant/lab-settings.py" "$REPO/vagrant/jupyter-server-labkit.json" "$SERVER_CONFIG")" ||
    die "could not set labkit's Jupyter server settings in $SERVER_CONFIG"
step server-settings "$out"

# ---------------------------------------------------------------- bytecode
# An editable install leaves labkit's modules uncompiled, and a process started with
# PYTHONDONTWRITEBYTECODE never writes their .pyc: then every kernel, loader, agent and pod
# server compiles labkit again at start.  compileall writes only what is missing or stale.
if [ -f "$REPO/labkit/__init__.py" ]; then
    run "$VENV/bin/python" -m compileall -q "$REPO/labkit" || die "python -m compileall $REPO/labkit failed"
    step bytecode "ok ($REPO/labkit compiled)"
fi

# ---------------------------------------------------------------- labkit on PATH
LABKIT_BIN="$VENV/bin/labkit"
LABKIT_LINK=/usr/local/bin/labkit
if [ -L "$LABKIT_LINK" ] && [ "$(readlink "$LABKIT_LINK")" = "$LABKIT_BIN" ]; then
    step path "ok ($LABKIT_LINK -> $LABKIT_BIN)"
else
    if [ -d "$LABKIT_LINK" ] && [ ! -L "$LABKIT_LINK" ]; then
        die "$LABKIT_LINK is a directory; not replacing it"
    fi
    mkdir -p "$(dirname "$LABKIT_LINK")"
    ln -sfn "$LABKIT_BIN" "$LABKIT_LINK"
    step path "done ($LABKIT_LINK -> $LABKIT_BIN)"
fi

# ---------------------------------------------------------------- final check
[ -x "$LABKIT_BIN" ] || die "$LABKIT_BIN is missing: pip did not install the labkit entry point"
if out="$(timeout 120 "$LABKIT_LINK" --version 2>&1)"; then
    step check "ok (labkit --version: $(printf '%s' "$out" | head -n 1))"
elif [ ! -e "$REPO/labkit/cli.py" ] && [ ! -e "$REPO/labkit/cli/__init__.py" ]; then
    step check "skipped (labkit.cli is not written yet; entry point $LABKIT_BIN is installed)"
else
    die "'labkit --version' failed: $(printf '%s' "$out" | tail -n 5)"
fi

# ---------------------------------------------------------------- the instructors' group
# Root and the members of labkit-instructors see and touch every user's labs and read the
# answer keys (labkit/door/owners.py).  Provisioning adds no one: the VM's vagrant is a learner.
out="$(ensure_group "$INSTRUCTORS_GROUP")" || die "could not make the group $INSTRUCTORS_GROUP (groupadd --system $INSTRUCTORS_GROUP)"
if [ "$out" = ok ]; then
    step instructors "ok (group $INSTRUCTORS_GROUP exists; add an instructor with: sudo adduser NAME $INSTRUCTORS_GROUP)"
else
    step instructors "done (made the system group $INSTRUCTORS_GROUP; add an instructor with: sudo adduser NAME $INSTRUCTORS_GROUP)"
fi

# ---------------------------------------------------------------- answer keys
# The answer keys (instructor/, beside labs/ in the checkout the VM was given) are not the
# learner's to read: root:labkit-instructors, 0750/0640.  Only where a learner account is named
# (the VM): a developer's own checkout is left as it is.  The Vagrantfile's rsync share keeps
# instructor/ out of its chown to vagrant and syncs it root's, 0750/0640, itself.
step_answer_keys() {
    local dir="$REPO/instructor" out
    if [ -z "$WORK_USER" ]; then
        step answer-keys "skipped (LABKIT_WORK_USER is not set: no learner to keep $dir from)"
    elif [ ! -d "$dir" ]; then
        step answer-keys "skipped ($dir does not exist)"
    elif out="$(lock_answer_keys "$dir" "$INSTRUCTORS_GROUP")"; then
        step answer-keys "$out ($dir is root:$INSTRUCTORS_GROUP, 0750, files 0640: not readable by $WORK_USER)"
    else
        warn "the answer keys stay readable by $WORK_USER: this file system would not take root:$INSTRUCTORS_GROUP 0750/0640 (a shared folder?); still open: $out"
        step answer-keys "skipped (the file system of $dir keeps its own owners and modes)"
    fi
}
step_answer_keys

# ---------------------------------------------------------------- labkitd
# labkitd (labkit/door/) is the one root service through which every privileged act of a lab
# passes; kernels and the labkit command reach it on /run/labkitd/labkitd.sock.  With systemd
# it is the unit labkitd (vagrant/labkitd.service), restarted only when its unit or labkit's code
# changed (labs keep running across a restart: KillMode=process).  Without systemd (a container,
# a CI host) it is started by hand, or by make test/lab/bench for their run.
LABKITD_SOCK="${LABKIT_DOOR:-/run/labkitd/labkitd.sock}"
labkitd_answers() { "$VENV/bin/python" -m labkit labkitd status >/dev/null 2>&1; }
step_labkitd() {
    if [ "$IMAGE" = 1 ]; then
        step labkitd "skipped (--image: the VM installs and starts it when it provisions)"
        return
    fi
    local template="$REPO/vagrant/labkitd.service" changed=0 digest state i
    [ -f "$template" ] || die "$template is missing"
    if write_if_changed "$LABKITD_UNIT_FILE" "$(labkitd_unit "$template" "$VENV")"; then
        changed=1
    fi
    if ! systemd_running; then
        if labkitd_answers; then
            step labkitd "ok (systemd is not running here; a labkitd answers on $LABKITD_SOCK; unit written to $LABKITD_UNIT_FILE)"
        else
            step labkitd "skipped (systemd is not running here; unit written to $LABKITD_UNIT_FILE; start labkitd with: sudo labkit daemon start)"
        fi
        return
    fi
    digest="$(source_digest "$REPO/labkit")"
    if [ ! -f "$LABKITD_STAMP" ] || [ "$(cat "$LABKITD_STAMP")" != "$digest" ]; then
        changed=1
    fi
    state="$(service_up labkitd "$changed")" || die "systemd could not start labkitd; see: journalctl -u labkitd"
    mkdir -p "$(dirname "$LABKITD_STAMP")"
    printf '%s\n' "$digest" >"$LABKITD_STAMP"
    # It answers once it has imported labkit and bound its socket: seconds, longer under emulation.
    for i in $(seq 1 120); do
        LABKIT_DOOR='' labkitd_answers && break # the unit's socket, whatever LABKIT_DOOR says
        [ "$i" = 120 ] && die "labkitd did not answer on /run/labkitd/labkitd.sock within 120 s; see: journalctl -u labkitd"
        sleep 1
    done
    if [ "$state" = ok ]; then
        step labkitd "ok (labkitd.service running, answering on /run/labkitd/labkitd.sock)"
    else
        step labkitd "done (labkitd.service enabled and (re)started, answering on /run/labkitd/labkitd.sock)"
    fi
}
step_labkitd

# ---------------------------------------------------------------- work folder
# JupyterLab serves the learner's own copies of the labs, made from labs/ and
# never overwritten: the repo itself is re-copied by every sync (labkit/workdir.py).
step_work() {
    if [ -z "$WORKDIR" ]; then
        step work "skipped (LABKIT_WORKDIR is not set; JupyterLab serves $REPO/labs)"
        return
    fi
    local given=0
    if [ -n "$WORK_USER" ]; then
        local group
        group="$(id -gn "$WORK_USER")" || die "LABKIT_WORK_USER=$WORK_USER: no such user"
        install -d -o "$WORK_USER" -g "$group" "$WORKDIR" || die "could not make the work folder $WORKDIR for $WORK_USER"
        # Everything in it is the learner's: what a JupyterLab running as root saved there (a VM
        # provisioned before JupyterLab ran as $WORK_USER) is given back, or their server could not save it.
        given="$(find "$WORKDIR" \( ! -user "$WORK_USER" -o ! -group "$group" \) -print | wc -l)"
        [ "$given" = 0 ] || find "$WORKDIR" \( ! -user "$WORK_USER" -o ! -group "$group" \) -exec chown -h "$WORK_USER:$group" {} +
    else
        mkdir -p "$WORKDIR"
    fi
    local out
    out="$("$LABKIT_LINK" work sync --dir "$WORKDIR" --labs "$REPO/labs" 2>&1)" ||
        die "labkit work sync --dir $WORKDIR failed: $(printf '%s' "$out" | tail -n 1)"
    local changes
    changes="$(printf '%s\n' "$out" | sed '$d')"
    if [ -n "$changes" ] || [ "$given" != 0 ]; then
        [ -z "$changes" ] || printf '%s\n' "$changes"
        local note=""
        [ "$given" = 0 ] || note="; $given files given back to $WORK_USER"
        step work "done ($(printf '%s' "$out" | tail -n 1)$note)"
    else
        step work "ok ($(printf '%s' "$out" | tail -n 1))"
    fi
}
step_work

# ---------------------------------------------------------------- JupyterLab service
step_jupyter_service() {
    local jupyter="$VENV/bin/jupyter"
    [ -x "$jupyter" ] || die "$jupyter is missing (the [notebook] extra installs JupyterLab)"

    # The server runs as the learner (LABKIT_WORK_USER; root on a host that names none), and so do
    # its kernels, with no capabilities: their labs' privileged acts go through labkitd.
    local user="${WORK_USER:-root}" group home
    group="$(id -gn "$user")" || die "LABKIT_WORK_USER=$user: no such user"
    home="$(getent passwd "$user" | cut -d: -f6)"
    [ -n "$home" ] || die "$user has no home directory in the passwd database"

    local token token_note=""
    if ! token="$(read_token)"; then
        (
            umask 077
            mkdir -p "$TOKEN_DIR"
            "$SYS_PY" -c 'import secrets; print(secrets.token_hex(16))' >"$TOKEN_FILE.tmp"
            mv -f "$TOKEN_FILE.tmp" "$TOKEN_FILE"
        )
        token="$(read_token)" || die "could not create $TOKEN_FILE"
        token_note="; new token in $TOKEN_FILE"
    fi

    # The token reaches Jupyter as JUPYTER_TOKEN from an environment file, not on the command line:
    # unit files and /proc/*/cmdline are world-readable.  systemd reads that file itself, as root,
    # before it starts the server as $user: it stays root's (0600), so the learner cannot change
    # their server's environment.  The token file is the server's user's, 0600: theirs to read
    # (cat $TOKEN_FILE), no one else's.
    local changed=0 new
    new="JUPYTER_TOKEN=$token"
    if [ ! -f "$JUPYTER_ENV_FILE" ] || [ "$(cat "$JUPYTER_ENV_FILE")" != "$new" ]; then
        (umask 077 && printf '%s\n' "$new" >"$JUPYTER_ENV_FILE")
        changed=1
    fi
    chmod 755 "$TOKEN_DIR"
    chown root:root "$JUPYTER_ENV_FILE"
    chown "$user:$group" "$TOKEN_FILE"
    chmod 600 "$TOKEN_FILE" "$JUPYTER_ENV_FILE"

    local ip="${LABKIT_JUPYTER_IP:-127.0.0.1}" root="${WORKDIR:-$REPO/labs}" root_note=""
    if [ ! -d "$root" ]; then
        root="$REPO"
        root_note="; $REPO/labs does not exist yet, serving $REPO"
    fi
    if write_if_changed "$UNIT_FILE" "$(jupyter_unit "$user" "$group" "$home" "$ip" "$root")"; then
        changed=1
    fi

    if ! systemd_running; then
        step jupyter-service "skipped (systemd is not running here; unit written to $UNIT_FILE; run 'make lab' to start JupyterLab in the foreground${root_note})"
    else
        local state
        state="$(service_up "$UNIT_NAME" "$changed")" || die "systemd could not start $UNIT_NAME; see: journalctl -u $UNIT_NAME"
        # Wait until the server answers (a fresh start takes a few seconds).
        local probe_ip="$ip" i
        [ "$probe_ip" = 0.0.0.0 ] && probe_ip=127.0.0.1
        # A fresh start takes seconds with KVM, and over a minute under qemu's emulation on a busy host
        # (make vm-test's run of 2026-12-02 waited 60 s in vain): give it 180.
        for i in $(seq 1 180); do
            if curl -fsS -o /dev/null -m 2 "http://$probe_ip:$JUPYTER_PORT/api/status?token=$token" 2>/dev/null; then
                break
            fi
            [ "$i" = 180 ] && die "JupyterLab did not answer on $probe_ip:$JUPYTER_PORT within 180 s; see: journalctl -u $UNIT_NAME"
            sleep 1
        done
        if [ "$state" = ok ]; then
            step jupyter-service "ok ($UNIT_NAME running as $user on $ip:$JUPYTER_PORT${root_note})"
        else
            step jupyter-service "done ($UNIT_NAME (re)started as $user on $ip:$JUPYTER_PORT${token_note}${root_note})"
        fi
    fi

    echo "=================================================================="
    url_line "$token"
    echo "  (print it again: sudo bash $REPO/vagrant/provision.sh --print-url)"
    if [ -n "$WORKDIR" ]; then
        echo "  (that is the VM's own port; from your computer use the 'labkit: JupyterLab:' URL"
        echo "   vagrant prints when it is done: the forwarded port can differ)"
    fi
    echo "=================================================================="
}
if [ "$JUPYTER_SERVICE" = 1 ]; then
    step_jupyter_service
fi

provision_ok
step finished "ok (${SECONDS}s)"
