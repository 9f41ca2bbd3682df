throw Symbol("sym");
