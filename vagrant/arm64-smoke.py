"""The arm64 smoke of vagrant/arm64-test.sh: labkit's bpf(2) wrapper on the guest's kernel, before any
provisioning (the system python3 only; no BCC, no venv).

    sudo python3 vagrant/arm64-smoke.py labkit/datapath/bpf.py

Maps: a hash map created, written, read, walked, batch-read and deleted from through
labkit/datapath/bpf.py, whose bpf(2) number on aarch64 is 280 (asm-generic/unistd.h; x86_64's is 321).
Program: `r0 = 2; exit`, hand-assembled, loaded as BPF_PROG_TYPE_SCHED_CLS and run once with
BPF_PROG_TEST_RUN on a 64-byte frame: the kernel (its arm64 JIT) must return 2 (TC_ACT_SHOT).
"""
import ctypes
import importlib.util
import platform
import struct
import sys

spec = importlib.util.spec_from_file_location("lkbpf", sys.argv[1])
bpf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bpf)
print("machine", platform.machine(), "syscall", bpf._SYS_BPF)
if platform.machine() == "aarch64":
    assert bpf._SYS_BPF == 280, bpf._SYS_BPF

BPF_MAP_TYPE_HASH = 1
fd = bpf.map_create(BPF_MAP_TYPE_HASH, 4, 8, 64, name="lk_smoke")
for k in range(10):
    bpf.update(fd, ctypes.create_string_buffer(struct.pack("=I", k), 4),
               ctypes.create_string_buffer(struct.pack("=Q", k * 1000), 8))
v = ctypes.create_string_buffer(8)
assert bpf.lookup(fd, ctypes.create_string_buffer(struct.pack("=I", 7), 4), v)
assert struct.unpack("=Q", v.raw)[0] == 7000
keys = sorted(struct.unpack("=I", k)[0] for k in bpf.all_keys(fd, 4))
assert keys == list(range(10)), keys
K, V = (ctypes.c_char * (4 * 64))(), (ctypes.c_char * (8 * 64))()
out = ctypes.create_string_buffer(4)
n, done = bpf.lookup_batch(fd, K, V, 64, None, out)
assert n == 10 and done, (n, done)
assert bpf.delete(fd, ctypes.create_string_buffer(struct.pack("=I", 3), 4))
assert len(bpf.all_keys(fd, 4)) == 9
print("maps: hash create/update/lookup/next_key/lookup_batch/delete ok")

# BPF_PROG_LOAD (5) of BPF_PROG_TYPE_SCHED_CLS (3): mov64 r0, 2 (0xb7, dst 0); exit (0x95)
insns = struct.pack("<BBhi", 0xB7, 0x00, 0, 2) + struct.pack("<BBhi", 0x95, 0, 0, 0)
ibuf = ctypes.create_string_buffer(insns, len(insns))
lic = ctypes.create_string_buffer(b"GPL")
attr = bpf._attr("=IIQQIIQI", 3, 2, ctypes.addressof(ibuf), ctypes.addressof(lic), 0, 0, 0, 0)
pfd = bpf._sys(5, attr, "prog load")
frame = ctypes.create_string_buffer(bytes(range(64)), 64)
dout = ctypes.create_string_buffer(128)
# BPF_PROG_TEST_RUN (10): prog_fd, retval, data_size_in, data_size_out, data_in, data_out, repeat, duration
attr = bpf._attr("=IIIIQQII", pfd, 0, 64, 128, ctypes.addressof(frame), ctypes.addressof(dout), 1, 0)
bpf._sys(10, attr, "prog test run")
retval = struct.unpack_from("=I", attr, 4)[0]
print("prog test run retval", retval)
assert retval == 2
print("arm64 smoke: ok")
