# gang-extender image: the `gang-extender` console script on a slim Python.
#
#   docker build -t gang-extender:dev .
#
# Stage 1 builds the project's wheel; stage 2 installs only that wheel and
# its runtime dependencies at the versions and hashes pinned in
# requirements.lock (`make lock`; all published as pure-Python or manylinux
# wheels, so no compiler is needed and none is in the image). tests/packaging
# checks this file and builds the wheel the same way.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY app ./app
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .
RUN cp requirements.lock /dist/requirements.lock

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /dist /tmp/dist
RUN python -m pip install --no-cache-dir --require-hashes -r /tmp/dist/requirements.lock \
    && python -m pip install --no-cache-dir --no-deps /tmp/dist/*.whl \
    && rm -rf /tmp/dist
# Numeric, so runAsNonRoot can verify it without an /etc/passwd lookup.
USER 65532:65532
# Verbs on 8888 (the chart binds them to 127.0.0.1), operations on 9090
# when --ops-port is set.
EXPOSE 8888 9090
ENTRYPOINT ["gang-extender"]
CMD ["serve"]
