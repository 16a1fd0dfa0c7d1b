"""The response cache: every reply a run generates, kept by what decides it (`keys`), so that a
rerun of a changed job, or the same evaluation against another model beside the old ones, pays
only for the requests that changed. One SQLite file (`store`) serves every lmpress process on
the machine; `responses` is what a run uses, `lmpress cache` (cli/cache.py) what a user does
with it."""
