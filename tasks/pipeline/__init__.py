"""The `submit` pipeline as a state machine, without Prefect.

    submitted -> planned -> placed -> training -> trained -> released -> evaluated -> reported
                    ^                     |
                    +---- recovering <----+            (and failed, from any stage)

`run.py` holds the `Run` record and the pure transitions (what a stage's outcome means for the run: the next
stage, the plans to place next, the recovery record); `drive.py` the loop that calls a `Stages` collaborator for
each transition and releases the GPUs on every exit path; `watch.py` the watch over a running trainer (hang,
lost lease, checkpoints evaluated as they commit). `flows/submit.py` gives the Prefect `Stages`; tests give fakes.
"""
