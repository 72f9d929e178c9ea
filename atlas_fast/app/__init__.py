"""The applications on top of the engine: the command line, the demo and the paper-ready report."""
