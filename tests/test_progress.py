import io

from fnlcore.progress import ProgressBar, round_reporter


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_on_a_terminal_and_logs_every_line():
    stream, lines = _TTY(), []
    rep = round_reporter(lines.append, ProgressBar(stream, width=10))
    rep("resumed from x at round 1")
    rep("round 0/1 [warmup] bacc=0.5000 (0.1s)")  # rounds count from 0, as in metrics
    rep("round 1/1 [stage2] bacc=0.6000 (0.1s)")
    assert len(lines) == 3
    out = stream.getvalue()
    assert "[#####.....] 1/2" in out and "[##########] 2/2" in out and out.endswith("\n")


def test_bar_is_silent_in_batch_logs():
    stream = io.StringIO()
    ProgressBar(stream).update(1, 2, "x")
    assert stream.getvalue() == ""
