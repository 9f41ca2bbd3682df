const e = new TypeError("typed");
throw e;
