# The agent's image: docker build -t storwatch:0.1.0 .
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY storwatch ./storwatch
RUN pip install --no-cache-dir . && rm -rf /src
USER 0
ENTRYPOINT ["storwatch"]
CMD ["agent"]
