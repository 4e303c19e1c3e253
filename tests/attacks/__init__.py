"""Attacks from outside (issue 33), each run as the user it would come from: a broker user of
the generated definitions in a vhost of the test's own (tests/support/vhost.py), an API token of
each role, an account of the remote service. Each test fails without the fix it guards; the
searches beside them (hypothesis over headers, schedules and bodies) are in tests/unit where no
server is needed.
"""
