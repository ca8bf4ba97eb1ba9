"""BPF unit tier: the compiled programs on crafted packets (BPF_PROG_TEST_RUN)."""
