# labkit -- everyday entry points.  All of them run as root (labkit drives
# network namespaces and BPF); provisioning is idempotent and takes seconds
# when nothing is missing.
VENV ?= /opt/labkit/venv
PY = $(VENV)/bin/python

# labkitd (labkit/door/) must answer for any lab to run: every privileged act of a lab goes through it.
# Who starts it:
#   test, lab, bench  each starts one (`labkitd start`: in the background, pid and log in /run/labkitd/)
#                     when none answers, and stops it when it ends only if it started it; a labkitd that
#                     was running already (systemd's unit labkitd, or `sudo labkit daemon start`) is left
#                     running.  .ci/run runs `make test`: CI's labkitd is make test's.
#   the VM            systemd (vagrant/labkitd.service, installed and started by provision.sh).
# $(call with_labkitd,COMMAND) is COMMAND run that way; it exits with COMMAND's status.  An interrupt
# (Ctrl-C) ends COMMAND, and the shell (its trap) still stops the labkitd it started.
LABKITD = $(PY) -m labkit labkitd
with_labkitd = started=0; trap : INT TERM; \
	if ! $(LABKITD) status >/dev/null 2>&1; then $(LABKITD) start || exit 1; started=1; fi; \
	$(1); rc=$$?; \
	if [ $$started = 1 ]; then $(LABKITD) stop; fi; \
	exit $$rc

.PHONY: provision provision-dev test unit lab bench vm-test arm64-test box clean

# Install system packages, kernel headers, bpffs, the venv and labkit itself.
provision:
	LABKIT_VENV=$(VENV) bash vagrant/provision.sh

# The same plus the test tools (pytest, clang, ...).
provision-dev:
	LABKIT_VENV=$(VENV) bash vagrant/provision.sh --dev

# THE test command (CI runs it through .ci/run); pytest options live in pyproject.toml.
test: provision-dev
	$(call with_labkitd,$(PY) -m pytest tests -ra -n auto --dist loadfile)

# Unit tests only, without provisioning.
unit:
	$(PY) -m pytest tests/unit -q

# JupyterLab in the foreground; it prints its URL with a fresh token.
lab: provision
	$(call with_labkitd,$(VENV)/bin/jupyter lab --ip=127.0.0.1 --port=8888 --no-browser --allow-root --ServerApp.root_dir=$(CURDIR)/labs)

bench: provision-dev
	$(call with_labkitd,$(PY) -m labkit bench --readme README.md)

# The VM end to end with the libvirt provider (a locally built Debian 12 box, qemu emulation without
# vmx/svm): vagrant up, labkit inside, JupyterLab's forward, lab 01 graded (LABKIT_VMTEST_LABS for more), the learner's work surviving
# reload and provision, then destroy and nothing left. Not part of `make test`: ~25 min emulated.
vm-test:
	bash vagrant/vm-test.sh $(VMTEST)

# The datapath on arm64: an arm64 Debian 12 machine (arm64-rootfs.sh: Debian's arm64 kernel and packages,
# provision.sh --dev in its chroot) booted with qemu-system-aarch64 (TCG emulation on x86_64); its init runs
# the smoke check, labkit doctor, tests/bpf and tests/unit as root.  Not part of `make test`: long emulated.
arm64-test:
	bash vagrant/arm64-test.sh

# A ready Vagrant box (libvirt, Debian 12, amd64) with everything provisioning installs, for a room
# without network: hand out the one file; `vagrant box add --name labkit/debian12 FILE`, then
# `LABKIT_BOX=labkit/debian12 vagrant up` provisions offline.  `make vm-test VMTEST=--offline-box` proves it.
BOX ?= dist/labkit-debian12-libvirt.box
box:
	bash vagrant/build-box.sh --provisioned $(BOX)

# Build artefacts only.
clean:
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .pytest_cache -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
