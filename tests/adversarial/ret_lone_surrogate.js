// A lone UTF-16 surrogate is a legal JS string and has a JSON spelling ("\ud800").
return "\ud800";
