"""A weather desk: current conditions and a short forecast from a bundled table.

    live serve --agent samples.weather:agent            # Gemini (needs GOOGLE_API_KEY)

The table stands in for a weather service; the tools show the shape a real one
would have: plain functions with type hints and a docstring the model reads.
"""

from __future__ import annotations

from live import Agent

MODEL = "gemini-3.1-flash-live-preview"

# city -> (sky, temperature °C, humidity %, wind km/h, next days as (sky, low, high))
_TABLE: dict[str, tuple[str, int, int, int, tuple[tuple[str, int, int], ...]]] = {
    "lisbon": ("sunny", 21, 55, 12, (("sunny", 15, 23), ("partly cloudy", 14, 22), ("rain", 13, 18))),
    "paris": ("overcast", 12, 78, 9, (("light rain", 8, 13), ("cloudy", 7, 12), ("sunny", 6, 14))),
    "tokyo": ("clear", 17, 60, 7, (("clear", 11, 19), ("clear", 12, 20), ("showers", 13, 17))),
    "nairobi": ("partly cloudy", 24, 50, 15, (("thunderstorms", 16, 25), ("sunny", 15, 27), ("sunny", 15, 27))),
    "reykjavik": ("snow", -2, 85, 30, (("snow", -5, 0), ("cloudy", -4, 1), ("windy", -3, 2))),
    "sao paulo": ("humid", 28, 82, 8, (("thunderstorms", 21, 29), ("rain", 20, 26), ("cloudy", 20, 27))),
}


def _city(name: str) -> str:
    return " ".join(name.lower().replace("ã", "a").split())


def _unknown(city: str) -> dict:
    known = ", ".join(sorted(c.title() for c in _TABLE))
    return {"error": f"no weather data for {city!r}", "known_cities": known}


def get_weather(city: str) -> dict:
    """Current weather for a city: sky, temperature in Celsius, humidity and wind."""
    row = _TABLE.get(_city(city))
    if row is None:
        return _unknown(city)
    sky, temp, humidity, wind, _ = row
    return {"city": city.title(), "sky": sky, "temperature_c": temp, "humidity_pct": humidity, "wind_kmh": wind}


def get_forecast(city: str, days: int = 3) -> dict:
    """Forecast for the next days (1 to 3) in a city, with low and high in Celsius."""
    row = _TABLE.get(_city(city))
    if row is None:
        return _unknown(city)
    if not 1 <= days <= 3:
        return {"error": "the forecast covers 1 to 3 days", "days_requested": days}
    return {
        "city": city.title(),
        "days": [{"day": i + 1, "sky": sky, "low_c": low, "high_c": high} for i, (sky, low, high) in enumerate(row[4][:days])],
    }


agent = Agent(
    name="weather",
    model=MODEL,
    instruction=(
        "You are a cheerful weather assistant. Use get_weather for current conditions and "
        "get_forecast for the coming days. Answer in one or two short spoken sentences. "
        "If a city is not known, say which cities you can help with. "
        f"Cities with data: {', '.join(sorted(c.title() for c in _TABLE))}."
    ),
    tools=[get_weather, get_forecast],
)
