"""STAND-IN for Prime Intellect's `verifiers` 0.4.0, for rlvr's tests only: 0.4.0's root package
has no classic API (no `load_environment`); its stack is `verifiers.v1` (./v1). Not the real
package: scripts/check_verifiers_env.py runs the same environments with verifiers 0.4.0 itself.
"""
__version__ = "0.4.0"
