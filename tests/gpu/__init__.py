"""The GPU target's tests (a package, so that its conftest is not the module ``conftest`` the other tests import)."""
