"""Reports: the JSON report format, its terminal and HTML renderings, and timing the parts of a result."""
