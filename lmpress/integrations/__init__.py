"""lmpress under other tools' APIs: each integration is the other tool's interface implemented
over any lmpress engine, so that tool's users get lmpress's engines and batching unchanged."""
