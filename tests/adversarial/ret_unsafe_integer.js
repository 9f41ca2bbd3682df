// 2**53 + 2 is a double, but past the safe integers: its digits would not mean the same integer in Python.
return [2 ** 53 + 2];
