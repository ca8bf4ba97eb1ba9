"""Datapath options: cilium-agent defaults, validation, copies and serialisation."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from labkit.config import POLICY_MODES, ROUTING_MODES, CtTimeouts, DatapathConfig
from labkit.errors import ConfigError, LabkitError

BPF = Path(__file__).resolve().parents[2] / "bpf"

# cilium-agent defaults (--bpf-ct-timeout-* flags, --bpf-ct-global-*-max).
AGENT_TIMEOUTS = {"tcp": 8000, "any": 60, "svc_tcp": 8000, "svc_any": 60, "svc_tcp_grace": 60, "syn": 60, "close": 10}
# Cilium's node_config.h macro for each lifetime.
AGENT_MACROS = {
    "CT_CONNECTION_LIFETIME_TCP": 8000,
    "CT_CONNECTION_LIFETIME_NONTCP": 60,
    "CT_SERVICE_LIFETIME_TCP": 8000,
    "CT_SERVICE_LIFETIME_NONTCP": 60,
    "CT_SERVICE_CLOSE_REBALANCE": 60,
    "CT_SYN_TIMEOUT": 60,
    "CT_CLOSE_TIMEOUT": 10,
}


def test_timeout_defaults_are_agent_defaults():
    """CtTimeouts() carries the cilium-agent's default lifetimes."""
    assert dataclasses.asdict(CtTimeouts()) == AGENT_TIMEOUTS


def test_datapath_defaults():
    """DatapathConfig() is tunnel routing with Cilium's default CT map sizes (524288 TCP, 262144 other)."""
    c = DatapathConfig()
    assert (c.routing, c.ct_tcp_size, c.ct_any_size) == ("tunnel", 524288, 262144)
    assert c.timeouts == CtTimeouts()
    assert set(ROUTING_MODES) == {"tunnel", "native"}


def test_macro_names():
    """macros() names each lifetime with Cilium's C macro."""
    assert CtTimeouts().macros() == AGENT_MACROS


def test_macros_used_by_the_datapath():
    """Every lifetime macro the BPF code reads is one macros() provides."""
    text = "\n".join(p.read_text() for p in list(BPF.glob("*.c")) + list(BPF.glob("lib/*.h")))
    used = {m for m in AGENT_MACROS if re.search(rf"\b{m}\b", text)}
    assert used  # the CT code does read lifetimes from macros
    assert used <= set(CtTimeouts().macros())


@pytest.mark.parametrize("routing", ["vxlan", "Tunnel", "", None, "geneve"])
def test_invalid_routing(routing):
    """An unknown routing mode is a ConfigError (and ValueError) naming the accepted modes."""
    with pytest.raises(ConfigError) as info:
        DatapathConfig(routing=routing)
    assert isinstance(info.value, ValueError) and isinstance(info.value, LabkitError)
    assert "tunnel" in str(info.value) and "native" in str(info.value)


@pytest.mark.parametrize("value", [0, -1, 2**31 + 1, 1.5, "60", True, None])
@pytest.mark.parametrize("name", ["tcp", "syn", "close"])
def test_invalid_timeouts(name, value):
    """Lifetimes must be whole seconds from 1 to 2^31; anything else is a ConfigError naming the lifetime."""
    with pytest.raises(ConfigError) as info:
        CtTimeouts(**{name: value})
    assert isinstance(info.value, ValueError)
    assert f"'{name}'" in str(info.value)


def test_timeout_bounds_accepted():
    """1 and 2^31 seconds are both accepted."""
    assert CtTimeouts(syn=1, tcp=2**31).macros()["CT_CONNECTION_LIFETIME_TCP"] == 2**31


@pytest.mark.parametrize("field", ["ct_tcp_size", "ct_any_size"])
@pytest.mark.parametrize("value", [0, 15, 16_777_217, -5, 1024.0, "1024"])
def test_invalid_sizes(field, value):
    """CT map sizes outside 16..16777216 entries are a ConfigError naming the option."""
    with pytest.raises(ConfigError) as info:
        DatapathConfig(**{field: value})
    assert isinstance(info.value, ValueError) and field in str(info.value)


def test_size_bounds_accepted():
    """16 and 16777216 entries are both accepted."""
    c = DatapathConfig(ct_tcp_size=16, ct_any_size=16_777_216)
    assert (c.ct_tcp_size, c.ct_any_size) == (16, 16_777_216)


def test_with_options():
    """with_options copies with changes; a timeouts dict changes only the named lifetimes."""
    base = DatapathConfig()
    c = base.with_options(routing="native", timeouts={"syn": 5, "close": 3}, ct_any_size=4096)
    assert (c.routing, c.ct_any_size, c.ct_tcp_size) == ("native", 4096, 524288)
    assert dataclasses.asdict(c.timeouts) == {**AGENT_TIMEOUTS, "syn": 5, "close": 3}
    assert base == DatapathConfig()  # unchanged
    c2 = base.with_options(timeouts=CtTimeouts(any=7))
    assert c2.timeouts.any == 7


def test_with_options_validates():
    """with_options re-validates: bad values raise ConfigError."""
    with pytest.raises(ConfigError):
        DatapathConfig().with_options(routing="bgp")
    with pytest.raises(ConfigError):
        DatapathConfig().with_options(timeouts={"syn": 0})


def test_round_trip_through_json():
    """to_dict is JSON-safe and from_dict(to_dict()) gives an equal config."""
    c = DatapathConfig(routing="native", timeouts=CtTimeouts(syn=9), ct_tcp_size=1024)
    data = json.loads(json.dumps(c.to_dict()))
    assert data["timeouts"]["syn"] == 9 and data["routing"] == "native"
    assert DatapathConfig.from_dict(data) == c


def test_from_dict_defaults_missing_keys():
    """from_dict of an empty dict is the default config."""
    assert DatapathConfig.from_dict({}) == DatapathConfig()


def test_from_dict_unknown_option():
    """An unknown top-level option is a ConfigError naming it."""
    with pytest.raises(ConfigError) as info:
        DatapathConfig.from_dict({"routing": "tunnel", "mtu": 1400})
    assert "mtu" in str(info.value)


def test_from_dict_unknown_timeout():
    """An unknown lifetime in a state file is a ConfigError naming it, like an unknown option."""
    with pytest.raises(ConfigError) as info:
        DatapathConfig.from_dict({"timeouts": {"syn": 60, "fin": 10}})
    assert "fin" in str(info.value)


def test_from_dict_invalid_values():
    """Invalid values read back from a dict raise ConfigError too."""
    with pytest.raises(ConfigError):
        DatapathConfig.from_dict({"routing": "bgp"})
    with pytest.raises(ConfigError):
        DatapathConfig.from_dict({"timeouts": {"tcp": -1}})


def test_lb_mode_and_maglev_size():
    """lb_mode defaults to dsr and takes snat/dsr/hybrid; the Maglev table size is one of Cilium's primes."""
    c = DatapathConfig()
    assert (c.lb_mode, c.maglev_table_size) == ("dsr", 16381)  # Cilium's --bpf-lb-maglev-table-size default
    assert DatapathConfig(lb_mode="hybrid", maglev_table_size=16381).lb_mode == "hybrid"
    for bad in ({"lb_mode": "geneve"}, {"lb_mode": "DSR"}, {"maglev_table_size": 250}, {"maglev_table_size": True}):
        with pytest.raises(ConfigError):
            DatapathConfig(**bad)
    assert DatapathConfig.from_dict(DatapathConfig(lb_mode="snat").to_dict()).lb_mode == "snat"


def test_policy_defaults_to_a_nodes_default():
    """A lab is a default node: policy mode 'default' (Cilium's --enable-policy default,
    daemon/cmd/daemon_main.go:370 and pkg/option/runtime_options.go:23@82999990), policy code compiled in, audit
    mode off."""
    c = DatapathConfig()
    assert (c.policy, c.policy_audit) == ("default", False)
    assert POLICY_MODES == ("default", "always", "never")  # Cilium's --enable-policy values


@pytest.mark.parametrize("value", ["Default", "on", "", None, True])
def test_invalid_policy_mode(value):
    """A policy mode other than default/always/never is a ConfigError naming the choices and the value."""
    with pytest.raises(ConfigError, match=r"policy enforcement: expected one of default, always, never"):
        DatapathConfig(policy=value)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_invalid_policy_audit(value):
    """policy_audit must be a bool."""
    with pytest.raises(ConfigError, match=r"policy_audit: expected True or False"):
        DatapathConfig(policy="default", policy_audit=value)


def test_policy_audit_needs_policy():
    """Audit mode without policy code has nothing to audit: a ConfigError naming policy 'never'."""
    with pytest.raises(ConfigError, match=r"policy_audit: expected policy 'default' or 'always'.*got policy 'never'"):
        DatapathConfig(policy="never", policy_audit=True)
    assert DatapathConfig(policy="always", policy_audit=True).policy_audit
    assert DatapathConfig(policy_audit=True).policy_audit  # the default mode has policy to audit


def test_policy_round_trips():
    """policy and policy_audit survive to_dict/from_dict."""
    c = DatapathConfig(policy="always", policy_audit=True)
    assert DatapathConfig.from_dict(c.to_dict()) == c


def test_observation_defaults_are_a_nodes():
    """Monitor aggregation medium (Helm's bpf.monitorAggregation), Hubble's 4095-flow ring, a 1 MiB events ring."""
    c = DatapathConfig()
    assert (c.monitor_aggregation, c.hubble_buffer_size, c.events_ring_pages) == ("medium", 4095, 256)


@pytest.mark.parametrize("field, value", [
    ("monitor_aggregation", "high"), ("monitor_aggregation", "5"),
    ("hubble_buffer_size", 4096), ("hubble_buffer_size", 0), ("hubble_buffer_size", True),
    ("events_ring_pages", 3), ("events_ring_pages", 0), ("events_ring_pages", 131072),
])
def test_invalid_observation_options(field, value):
    """A level Cilium does not know, a ring capacity that is not 2^n-1, or a ring that is not a power of two of
    pages is a ConfigError naming the option and the value."""
    with pytest.raises(ConfigError, match=re.escape(repr(value))):
        DatapathConfig(**{field: value})


def test_monitor_aggregation_levels_parse_as_cilium():
    """MonitorAggregation takes Cilium's names and numbers (pkg/option/monitor.go monitorAggregationOption)."""
    from labkit.maps.config import LabConfig, MonitorAggregation

    assert [MonitorAggregation.parse(v) for v in ("none", "disabled", "lowest", "low", "medium", "max", "maximum", "3")] \
        == [0, 0, 1, 2, 3, 4, 4, 3]
    assert MonitorAggregation.MAX.label == "maximum" and MonitorAggregation.LOWEST.label == "lowest"
    with pytest.raises(ValueError, match="'high'"):
        MonitorAggregation.parse("high")
    assert LabConfig.initial().monitor_aggregation == MonitorAggregation.MEDIUM
    for name in ("none", "lowest", "low", "medium", "maximum"):
        DatapathConfig(monitor_aggregation=name)  # every `labkit up --monitor-aggregation` choice is valid


def test_sockmap_mode_is_checked():
    """sockmap is 'off' by default; an unknown mode is a ConfigError naming the choices."""
    assert DatapathConfig().sockmap == "off"
    with pytest.raises(ConfigError, match="sockmap: expected one of off, on, got 'yes'"):
        DatapathConfig(sockmap="yes")


def test_nodeport_accel_default_and_values():
    """NodePort acceleration is 'none' by default (Cilium's --bpf-lb-acceleration=disabled); 'xdp' with native
    routing is accepted and survives to_dict/from_dict; any other value is a ConfigError naming the choices."""
    assert DatapathConfig().nodeport_accel == "none"
    c = DatapathConfig(routing="native", nodeport_accel="xdp")
    assert DatapathConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="expected one of none, xdp, got 'native'"):
        DatapathConfig(routing="native", nodeport_accel="native")


def test_no_backend_response_default_and_values():
    """A Service without backends is rejected by default (Cilium's --service-no-backend-response=reject); 'drop'
    survives to_dict/from_dict; any other value is a ConfigError naming the choices."""
    assert DatapathConfig().no_backend_response == "reject"
    c = DatapathConfig(no_backend_response="drop")
    assert DatapathConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="expected one of reject, drop, got 'ignore'"):
        DatapathConfig(no_backend_response="ignore")


@pytest.mark.parametrize("options", [{"routing": "tunnel"}, {"routing": "native", "service_mode": "iptables"}])
def test_nodeport_accel_xdp_needs_native_ebpf(options):
    """'xdp' with tunnel routing or kube-proxy's Services is a ConfigError saying what it needs and what it got."""
    with pytest.raises(ConfigError, match="expected routing 'native' and service mode 'ebpf'"):
        DatapathConfig(nodeport_accel="xdp", **options)
