// JSON has no NaN or Infinity: JSON.stringify spells them null; -0 becomes 0.
return [NaN, Infinity, -Infinity, -0, 0, 2 ** 53 - 1, 2147483648, -2147483649, 0.1];
