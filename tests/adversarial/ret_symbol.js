return Symbol("s");
