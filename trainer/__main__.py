"""``python -m trainer`` runs ``python -m orch_trainer`` (same flags, exit codes and run-dir contract)."""


from orch_trainer.__main__ import exit_now, main

if __name__ == "__main__":
    exit_now(main())
