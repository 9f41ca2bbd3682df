const a = [1];
a[5] = 6;
return a;
