"""The test suite's time budget: which chain of jobs decided a run's wall time, and which jobs
ran over the ceiling the test plan gives them (scripts/lib/test-plan.py, CEILINGS).

Pure functions over what the runner recorded, so that scripts/lib/test_budget_test.py checks
them without running anything.
"""

# The runner looks for startable jobs whenever one finishes (and every 2 s in any case): a job
# that started within this long after another ended was waiting for it.
SLACK = 2.5


class Span:
    """One finished job: when it started and ended (seconds after the runner began), and the
    jobs the plan runs it after."""

    def __init__(self, name, start, end, after=()):
        self.name = name
        self.start = start
        self.end = end
        self.after = set(after)

    @property
    def seconds(self):
        return self.end - self.start


def critical_path(spans):
    """The chain of jobs that decided the wall time, first to last.

    It ends with the job that finished last. Each job's predecessor is what it waited for: the
    latest-ending job it runs after when that ended just before it started, otherwise the job
    that ended just before it started (it freed the cores or the exclusive group the job
    needed). A job that started with the runner, or long after anything ended, starts the
    chain.
    """
    spans = [span for span in spans if span.end is not None and span.start is not None]
    if not spans:
        return []
    chain = [max(spans, key=lambda span: (span.end, span.start))]
    while True:
        current = chain[-1]
        waited = [
            span for span in spans
            if span is not current and span not in chain
            and current.start - SLACK <= span.end <= current.start + SLACK
        ]
        if not waited:
            break
        declared = [span for span in waited if span.name in current.after]
        chain.append(max(declared or waited, key=lambda span: span.end))
    chain.reverse()
    return chain


def over_ceiling(spans, ceilings):
    """(span, ceiling) for every job that ran longer than its ceiling, longest first."""
    over = [
        (span, ceilings[span.name]) for span in spans
        if span.name in ceilings and ceilings[span.name] and span.seconds > ceilings[span.name]
    ]
    return sorted(over, key=lambda pair: -pair[0].seconds)
