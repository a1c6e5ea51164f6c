"""Test doubles shared by the test suites: stand-ins for what the product talks to, kept out of
the product package so that no fake ships with it."""
