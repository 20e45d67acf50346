import subprocess
import sys
import textwrap

import pytest

# Allocate, touch and free a 64 MB tensor, sixteen times; print the minor page faults of the last round.
SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from spanlm.accel.host_memory import retain_freed_memory
    took = retain_freed_memory() if sys.argv[1] == "retain" else False
    for _ in range(16):  # retained, glibc settles on reusing one block within about eight rounds
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.empty(16 * 1024 * 1024)  # 64 MB: above glibc's largest mmap threshold
        t.fill_(1.0)
        del t
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(took, faults)
""")


def last_round_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True).stdout
    took, faults = out.split()
    return took, int(faults)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc tuning is Linux-only")
@pytest.mark.slow
def test_retained_memory_is_reused_without_page_faults():
    took, retained = last_round_faults("retain")
    if took != "True":
        pytest.skip("not glibc")
    _, system = last_round_faults("system")
    pages = 64 * 1024 * 1024 // 4096
    assert system > pages // 2  # the default: a fresh mmap, every page faulted in again
    assert retained < pages // 10  # retained: the freed pages are reused as they are
