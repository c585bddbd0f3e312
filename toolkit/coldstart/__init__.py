"""coldstart: snapshot a warmed-up vLLM server once, restore it in seconds at every start."""
__version__ = "0.1.0"
