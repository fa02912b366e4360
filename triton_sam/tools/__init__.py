"""What a user runs besides serving: the demo, ``segment``, segment everything (served and
in-process) and the sample image."""
