"""How a role becomes part of a topic name: ``format()`` of the enum member, as upstream's
f-strings do (``Role.COLLECTOR`` on Python >= 3.11, ``collector`` before)."""


def role_topic(prefix, role):
    return f"{prefix}_{role}"
