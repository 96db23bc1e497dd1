"""The dashboard in a real browser (Debian's chromium through Selenium)."""
