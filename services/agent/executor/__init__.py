"""The per-task executor process (`python -m services.agent.executor`): it
starts a task — isolated for the exec driver — stays its parent, and
records how it ended. Standard library only, so it starts fast."""
