// A plain infinite loop at top level.
while (true) {}
