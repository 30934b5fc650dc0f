# One image for every stage: `ratifier stages|approval-join|executor|reconciler|audit sink|
# dashboard|notifier|migrate`
# (deploy/k8s, deploy/compose.yaml). Build: docker build -t ratifier:dev .
FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY schemas/ schemas/
COPY config/ config/
COPY commands/ commands/
COPY feeds/ feeds/
COPY runtime/ runtime/
COPY approvals/ approvals/
COPY streams/ streams/
COPY executors/ executors/
COPY audit/ audit/
COPY dashboard/ dashboard/
COPY telemetry/ telemetry/
COPY ratifier/ ratifier/
COPY examples/ examples/
COPY testsupport/ testsupport/
COPY clients/python/ratifier_client/ clients/python/ratifier_client/
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 ratifier \
 && useradd --system --uid 10001 --gid ratifier --home-dir /var/lib/ratifier --create-home \
    --shell /usr/sbin/nologin ratifier
COPY --from=build /wheels /wheels
# The version must match pyproject.toml (a unit test checks it).
RUN pip install --no-index --find-links /wheels ratifier==0.1.0 && rm -rf /wheels
# `ratifier migrate` and the workers' schema check read deploy/migrations next to the installed
# packages (ratifier/migrate.py: MIGRATIONS_DIR), which a wheel does not carry.
COPY deploy/migrations/ /usr/local/lib/python3.11/site-packages/deploy/migrations/
USER 10001:10001
WORKDIR /var/lib/ratifier
EXPOSE 6066 6070 9102 9103 9104
ENTRYPOINT ["ratifier"]
CMD ["--help"]
