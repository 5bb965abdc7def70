"""tensorlang: a textual language for tensor-program schedules, lowered through Apache TVM."""
__version__ = "0.1.0"
