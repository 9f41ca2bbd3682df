// 600000 UTF-16 units but 1.2 MB of UTF-8: the host's byte count catches it.
return "é".repeat(600000);
