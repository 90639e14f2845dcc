"""The runner of the PyTorch test modules written as plain test_* functions (test_vae_swap, test_bounded,
test_inductor_pass): pytest collects them itself, `python3 -m unittest` takes them through load_tests_of, and
`python3 test_X.py` through main (a line a test with its time; ctest's exit codes: 1 failed, 77 nothing ran).

GNSILU_TEST_REQUIRE_TORCH=1 (.ci/run installs the pinned PyTorch and diffusers): a missing dependency or a skipped
test is a failure instead of a skip.
"""
import contextlib
import os
import sys
import time
import traceback
import unittest

REQUIRE = "GNSILU_TEST_REQUIRE_TORCH"


def dependencies_missing(module_name, label, missing):
    """For a test module's `except ImportError` (module_name: its __name__): run as a script, it exits (1 under
    GNSILU_TEST_REQUIRE_TORCH=1, else 77: ctest's Skipped); under pytest the whole module is skipped; under unittest
    every test skips on its own (each calls its require())."""
    if module_name == "__main__":
        if os.environ.get(REQUIRE) == "1":
            print(f"{label}: FAILED: {REQUIRE}=1 but {missing}")
            sys.exit(1)
        print(f"{label}: skipped: {missing}")
        sys.exit(77)
    if "pytest" in sys.modules:
        raise unittest.SkipTest(missing)


@contextlib.contextmanager
def one_thread():
    """Tiny models gain nothing from more threads, and on a busy machine several OpenMP threads per op lose a lot
    (seconds instead of milliseconds per model); the thread count of the process is restored after. Without PyTorch:
    nothing."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def tests_of(namespace):
    """The test_* functions of a module's globals(), by name."""
    return [(name, f) for name, f in sorted(namespace.items()) if name.startswith("test_") and callable(f)]


def load_tests_of(namespace):
    """For python3 -m unittest: the test functions as test cases."""
    suite = unittest.TestSuite()
    for name, test in tests_of(namespace):
        suite.addTest(unittest.FunctionTestCase(test, description=name))
    return suite


def main(namespace, label, require_note="", context=contextlib.nullcontext):
    """Runs every test function in turn within context(), a line each; returns the exit status."""
    tests = tests_of(namespace)
    failed = skipped = 0
    start = time.time()
    with context():
        for name, test in tests:
            t = time.time()
            try:
                test()
            except unittest.SkipTest as e:
                skipped += 1
                print(f"SKIP {name}: {e}")
            except Exception as e:  # noqa: BLE001  (report every test)
                failed += 1
                traceback.print_exc()
                print(f"FAIL {name}: {type(e).__name__}: {e}")
            else:
                print(f"ok   {name} ({time.time() - t:.2f} s)")
    print(f"{len(tests)} tests, {failed} failed, {skipped} skipped, {time.time() - start:.1f} s")
    if failed:
        return 1
    if skipped and os.environ.get(REQUIRE) == "1":
        print(f"{label}: FAILED: {skipped} tests skipped under {REQUIRE}=1{require_note}")
        return 1
    if skipped == len(tests):
        print(f"{label}: skipped: every test skipped")
        return 77  # ctest: Skipped, never Passed with nothing run
    return 0
