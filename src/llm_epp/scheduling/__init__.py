"""The scheduling core: profiles (filters -> weighted scorers -> picker) run by a profile handler."""

from llm_epp.scheduling.profile import SchedulerProfile, WeightedScorer
from llm_epp.scheduling.scheduler import Scheduler, SchedulingFailedError

__all__ = ["Scheduler", "SchedulerProfile", "SchedulingFailedError", "WeightedScorer"]
