return NaN;
