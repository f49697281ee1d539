"""L2: proposers (a playbook of measured rules, an LLM over an OpenAI-compatible endpoint) whose plans go
through the same admission, measurement and keep/revert as everything else (``l2.run.run_l2``)."""
from .context import TaskContext, build_context
from .proposer import Proposal, Proposals, Proposer, admit, triage
from .run import (DEFAULT_BUDGET, MODES, PROPOSERS, Fate, L2Result, L2Settings, Queue, make_proposers, run_l2,
                  task_phase, trigger)

__all__ = ["DEFAULT_BUDGET", "MODES", "PROPOSERS", "Fate", "L2Result", "L2Settings", "Proposal", "Proposals", "Proposer",
           "Queue", "TaskContext", "admit", "build_context", "make_proposers", "run_l2", "task_phase", "trigger"]
