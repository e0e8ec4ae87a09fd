"""Performance harnesses (`poolpilot perf NAME`): developer tools, not shipped in the images."""
