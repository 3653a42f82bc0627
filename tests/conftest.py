"""Suite-wide test settings.

Hypothesis: no per-example deadline (CI machines vary in speed; a slow example is not a wrong
one) and derandomized example generation, so that a run is reproducible and a landing never
depends on the draw. Property tests still cover their whole strategy space over time through the
examples each test's own ``max_examples`` asks for.
"""

from hypothesis import settings

settings.register_profile("blueprinting", deadline=None, derandomize=True)
settings.load_profile("blueprinting")
