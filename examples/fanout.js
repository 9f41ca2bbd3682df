// Fan out: look up many cities at once, then aggregate.
// Run it from the repository root with: nous-sched run examples/fanout.js --tools examples/tools.py
// lookup_city is concurrency-safe, so the scheduler runs these calls side by
// side (up to --max-parallel at once) and still commits them in the order the
// program made them.
const names = [
  "Tokyo", "Delhi", "Shanghai", "Sao Paulo", "Mexico City", "Cairo",
  "Mumbai", "Beijing", "Osaka", "Lagos", "Paris", "Lima",
];
const cities = await Promise.all(names.map((name) => tools.lookup_city({ name })));

const byCountry = {};
for (const city of cities) {
  byCountry[city.country] = (byCountry[city.country] || 0) + city.population;
}
const total = cities.reduce((sum, city) => sum + city.population, 0);
const largest = cities.reduce((a, b) => (b.population > a.population ? b : a));

console.log(`looked up ${cities.length} cities in ${Object.keys(byCountry).length} countries`);
console.log(`largest: ${largest.name}, ${largest.country} (${largest.population})`);
return { cities: cities.length, total_population: total, largest: largest.name, by_country: byCountry };
