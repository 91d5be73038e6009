"""Unit tests of scripts/lib/test_budget.py (a job of scripts/test's plan):

    python3 -m unittest discover -s scripts/lib -p '*_test.py'
"""

import unittest

from test_budget import Span, critical_path, over_ceiling


def names(chain):
    return [span.name for span in chain]


class CriticalPath(unittest.TestCase):
    def test_a_chain_of_declared_predecessors(self):
        spans = [
            Span("setup helm", 0, 150),
            Span("unit tests", 0, 40),
            Span("helm chart", 150.4, 300, after=["setup helm"]),
            Span("short", 40.2, 60),
        ]
        self.assertEqual(names(critical_path(spans)), ["setup helm", "helm chart"])

    def test_the_job_that_freed_the_cores_is_the_predecessor(self):
        # "guests" had no declared predecessor: it waited for "deployed" to give back the cores.
        spans = [
            Span("deployed", 0, 500),
            Span("small", 0, 20),
            Span("guests", 501, 900),
        ]
        self.assertEqual(names(critical_path(spans)), ["deployed", "guests"])

    def test_a_declared_predecessor_wins_over_one_that_ended_at_the_same_moment(self):
        spans = [
            Span("setup oldest", 0, 300),
            Span("other", 0, 300.5),
            Span("oldest deployed", 301, 450, after=["setup oldest"]),
        ]
        self.assertEqual(names(critical_path(spans)), ["setup oldest", "oldest deployed"])

    def test_a_job_that_started_long_after_anything_ended_starts_the_chain(self):
        spans = [Span("early", 0, 10), Span("late", 60, 200)]
        self.assertEqual(names(critical_path(spans)), ["late"])

    def test_the_chain_ends_with_the_last_job_to_finish(self):
        spans = [Span("a", 0, 100), Span("b", 100, 150), Span("c", 0, 400)]
        self.assertEqual(names(critical_path(spans)), ["c"])

    def test_unfinished_jobs_and_no_jobs(self):
        self.assertEqual(critical_path([]), [])
        self.assertEqual(names(critical_path([Span("never", None, None), Span("a", 0, 5)])), ["a"])


class Ceilings(unittest.TestCase):
    def test_only_jobs_over_their_ceiling_longest_first(self):
        spans = [Span("fast", 0, 100), Span("slow", 0, 700), Span("slower", 0, 900),
                 Span("unbounded", 0, 5000)]
        over = over_ceiling(spans, {"fast": 300, "slow": 600, "slower": 600, "unbounded": 0})
        self.assertEqual([(span.name, ceiling) for span, ceiling in over],
                         [("slower", 600), ("slow", 600)])

    def test_a_job_at_its_ceiling_is_not_over(self):
        self.assertEqual(over_ceiling([Span("exact", 10, 310)], {"exact": 300}), [])


if __name__ == "__main__":
    unittest.main()
