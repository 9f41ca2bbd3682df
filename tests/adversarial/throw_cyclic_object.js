const o = {}; o.self = o;
throw o;
