"""The contracts every plugin and the server depend on: types, plugin Protocols, registry,
parameter helpers and the scheduler loop."""
