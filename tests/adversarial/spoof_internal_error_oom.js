// The program throws its own InternalError that merely says "out of memory".
throw new InternalError("out of memory");
