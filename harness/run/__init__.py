"""The rank's runtime: its device and process groups, the parts it builds, the loop, the timeline and records."""
