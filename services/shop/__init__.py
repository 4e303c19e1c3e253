"""The submitting application's side of the order contract (a shop's front end): orders built
and read, published with confirms, their status messages followed. `orderflow submit` and the
benchmark use it as a shop would."""
