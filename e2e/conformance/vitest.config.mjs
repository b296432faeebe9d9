export default {
  test: {
    include: ["conformance.test.ts"],
    testTimeout: 30000,
    hookTimeout: 30000,
    reporters: ["default", "json"],
    outputFile: { json: "results.json" },
  },
}
