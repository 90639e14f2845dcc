"""Timing of one GPU call from Python for the tools' benchmarks (bench_bias.py, bench_padded.py): the method of
docs/PERFORMANCE.md, CUDA events around the call, L2 flushed before each, median."""
import statistics


def median_us(torch, function, runs, flush):
    """Median microseconds of `runs` calls of function() (two more first, as warm-up), each timed with CUDA events
    after `flush` (a tensor larger than L2) is zeroed, so that no call finds its data in L2."""
    times = []
    for _ in range(runs + 2):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times[2:])
