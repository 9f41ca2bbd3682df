throw {code: 7, why: "object"};
