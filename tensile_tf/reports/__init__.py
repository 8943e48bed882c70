"""What a run shows its user, from the typed records of
``tensile_tf.runtime.records``: ``outputs`` (results.json, trace.json,
memory.png, the console's plan summary) and ``compare`` (``--compare-vanilla``:
the planned run against the unplanned one, credited only beyond vanilla's
own spread)."""
