"""The dataflow a config makes: its worker kinds, the streams between them, the algorithms
and the data layouts they declare, and the plan that wires them (`plan.py`)."""
