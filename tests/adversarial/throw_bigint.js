throw 10n;
