throw "a string";
