"""What every process follows of the fleet's compacted topics, and publishes to them:
the policy set in force (`policies`) and the freezes in force (`controls`). The decisions on
them are pure and live in `commands`; this package is their Kafka edge."""
