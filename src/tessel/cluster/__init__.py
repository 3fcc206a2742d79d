"""Starting workers: torch's elastic launcher on this machine (launch)."""
