"""Many pairs behind one server (qkv.serve.registry, qkv.serve.detect): three models answer the
real ``libretranslatepy`` client for each pair, /languages lists each source with its targets as
LibreTranslate does, /detect and ``source: "auto"`` name the language of real sentences, a pair
with no model pivots through a common language and says so, models load when first asked and
the least recently used is unloaded beyond the memory cap, unknown pairs are a 400 naming what
is served, and every answer is the one the model gives alone."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from _serve_helpers import PAIRS, SOURCES, live_app, tiny_model_folder
from test_serve_metrics import parse, value

from qkv.serve import ServeConfig, create_app
from qkv.serve.registry import ModelRegistry, inspect_folder
from qkv.translate import Translator

#: English and French sources (the bundled pairs' two sides)
EN = SOURCES[:12]
FR = [t for _, t in PAIRS[:12]]

#: 20 real sentences per language (everyday sentences and software messages), written for
#: these tests: what /detect must name, 95% of them at least
SENTENCES = {
    "en": [
        "The bakery on the corner opens at seven in the morning.",
        "Remember to water the plants while I am away.",
        "Our flight was delayed because of the storm.", "Could you turn the music down a little?",
        "The new library has a large reading room.",
        "He fixed the bicycle with an old screwdriver.", "Unsaved changes will be lost.",
        "The river froze early this winter.", "We are looking for volunteers for the weekend.",
        "Please check your spelling and try again.", "My grandmother makes the best apple pie.",
        "The printer is out of paper.", "They walked along the beach until sunset.",
        "Select the files you want to upload.", "The doctor told him to rest for a few days.",
        "I have never seen such a beautiful sunrise.",
        "The bus to the airport leaves every twenty minutes.",
        "Your subscription expires next month.",
        "The students asked many questions after the lecture.",
        "Do you know a good restaurant near the harbour?",
    ],
    "fr": [
        "La boulangerie du coin ouvre à sept heures du matin.",
        "N'oublie pas d'arroser les plantes pendant mon absence.",
        "Notre vol a été retardé à cause de la tempête.", "Pourrais-tu baisser un peu la musique ?",
        "La nouvelle bibliothèque possède une grande salle de lecture.",
        "Il a réparé le vélo avec un vieux tournevis.",
        "Les modifications non enregistrées seront perdues.", "La rivière a gelé tôt cet hiver.",
        "Nous cherchons des bénévoles pour le week-end.", "Vérifiez l'orthographe et réessayez.",
        "Ma grand-mère fait la meilleure tarte aux pommes.", "L'imprimante n'a plus de papier.",
        "Ils ont marché le long de la plage jusqu'au coucher du soleil.",
        "Sélectionnez les fichiers que vous voulez envoyer.",
        "Le médecin lui a conseillé de se reposer quelques jours.",
        "Je n'ai jamais vu un lever de soleil aussi beau.",
        "Le bus pour l'aéroport part toutes les vingt minutes.",
        "Votre abonnement expire le mois prochain.",
        "Les étudiants ont posé beaucoup de questions après le cours.",
        "Connaissez-vous un bon restaurant près du port ?",
    ],
    "de": [
        "Die Bäckerei an der Ecke öffnet um sieben Uhr morgens.",
        "Denk daran, die Pflanzen zu gießen, während ich weg bin.",
        "Unser Flug hatte wegen des Sturms Verspätung.",
        "Könntest du die Musik etwas leiser machen?", "Die neue Bibliothek hat einen großen Lesesaal.",
        "Er hat das Fahrrad mit einem alten Schraubenzieher repariert.",
        "Nicht gespeicherte Änderungen gehen verloren.",
        "Der Fluss ist diesen Winter früh zugefroren.", "Wir suchen Freiwillige für das Wochenende.",
        "Bitte überprüfen Sie die Rechtschreibung und versuchen Sie es erneut.",
        "Meine Großmutter backt den besten Apfelkuchen.", "Der Drucker hat kein Papier mehr.",
        "Sie gingen bis zum Sonnenuntergang am Strand entlang.",
        "Wählen Sie die Dateien aus, die Sie hochladen möchten.",
        "Der Arzt sagte ihm, er solle sich ein paar Tage ausruhen.",
        "Einen so schönen Sonnenaufgang habe ich noch nie gesehen.",
        "Der Bus zum Flughafen fährt alle zwanzig Minuten.",
        "Ihr Abonnement läuft nächsten Monat ab.",
        "Die Studenten stellten nach der Vorlesung viele Fragen.",
        "Kennst du ein gutes Restaurant in der Nähe des Hafens?",
    ],
    "zh": [
        "街角的面包店早上七点开门。", "我不在的时候记得给植物浇水。", "我们的航班因为暴风雨延误了。",
        "你能把音乐调小一点吗？", "新图书馆有一个很大的阅览室。", "他用一把旧螺丝刀修好了自行车。",
        "未保存的更改将会丢失。", "今年冬天河水很早就结冰了。", "我们正在招募周末的志愿者。",
        "请检查拼写后重试。", "我奶奶做的苹果派最好吃。", "打印机没有纸了。",
        "他们沿着海滩一直走到日落。", "请选择您要上传的文件。", "医生让他休息几天。",
        "我从来没有见过这么美的日出。", "去机场的公共汽车每二十分钟一班。", "您的订阅将于下个月到期。",
        "讲座结束后学生们问了很多问题。", "你知道港口附近有什么好餐馆吗？",
    ],
    "ru": [
        "Булочная на углу открывается в семь утра.",
        "Не забудь полить цветы, пока меня не будет.", "Наш рейс задержали из-за шторма.",
        "Не мог бы ты сделать музыку потише?", "В новой библиотеке есть большой читальный зал.",
        "Он починил велосипед старой отвёрткой.", "Несохранённые изменения будут потеряны.",
        "Этой зимой река замёрзла рано.", "Мы ищем волонтёров на выходные.",
        "Проверьте правописание и попробуйте ещё раз.",
        "Моя бабушка печёт самый вкусный яблочный пирог.", "В принтере закончилась бумага.",
        "Они гуляли по пляжу до самого заката.", "Выберите файлы, которые вы хотите загрузить.",
        "Врач сказал ему отдохнуть несколько дней.", "Я никогда не видел такого красивого рассвета.",
        "Автобус в аэропорт ходит каждые двадцать минут.",
        "Ваша подписка истекает в следующем месяце.", "После лекции студенты задали много вопросов.",
        "Ты знаешь хороший ресторан недалеко от порта?",
    ],
    "ar": [
        "يفتح المخبز الذي على الزاوية في السابعة صباحًا.", "تذكّر أن تسقي النباتات أثناء غيابي.",
        "تأخرت رحلتنا بسبب العاصفة.", "هل يمكنك أن تخفض صوت الموسيقى قليلًا؟",
        "في المكتبة الجديدة قاعة مطالعة كبيرة.", "أصلح الدراجة بمفك براغٍ قديم.",
        "ستفقد التغييرات غير المحفوظة.", "تجمّد النهر مبكرًا هذا الشتاء.",
        "نبحث عن متطوعين لعطلة نهاية الأسبوع.", "يرجى التحقق من الإملاء والمحاولة مرة أخرى.",
        "جدتي تصنع أفضل فطيرة تفاح.", "نفد الورق من الطابعة.",
        "مشوا على طول الشاطئ حتى غروب الشمس.", "اختر الملفات التي تريد رفعها.",
        "نصحه الطبيب بأن يرتاح بضعة أيام.", "لم أر شروقًا بهذا الجمال من قبل.",
        "تغادر الحافلة إلى المطار كل عشرين دقيقة.", "ينتهي اشتراكك في الشهر القادم.",
        "طرح الطلاب أسئلة كثيرة بعد المحاضرة.", "هل تعرف مطعمًا جيدًا بالقرب من الميناء؟",
    ],
}  # fmt: skip

#: the models saved for these tests: pair -> (seed, tokenizers trained French -> English)
MODELS = {
    "en-fr": (1, False),
    "fr-en": (2, True),
    "en-de": (3, False),
    "en-zh": (4, False),
    "ru-en": (5, False),
    "ar-en": (6, False),
}
THREE = ("en-fr", "fr-en", "en-de")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairs")
    return {
        pair: tiny_model_folder(root / pair, tuple(pair.split("-")), seed=seed, reverse=reverse)  # type: ignore[arg-type]
        for pair, (seed, reverse) in MODELS.items()
    }


@pytest.fixture(scope="module")
def ref(folders) -> dict[str, Translator]:
    """Each model loaded alone: the reference every answer is compared with."""
    return {pair: Translator.load(folder) for pair, folder in folders.items()}


def registry(folders: dict[str, Path], pairs=THREE) -> ModelRegistry:
    return ModelRegistry.from_folders([inspect_folder(folders[p]) for p in pairs])


@pytest.fixture(scope="module")
def three(folders):
    """A server of the three models en-fr, fr-en, en-de (batching on, 20 ms wait)."""
    with live_app(create_app(registry(folders), ServeConfig(max_wait_ms=20))) as s:
        yield s


def pivoted(ref, texts):
    """fr -> de as the server must answer it: fr-en's translation, then en-de's of each
    sentence's translation (not cut into sentences again)."""
    return ref["en-de"].translate(ref["fr-en"].translate(texts), split="none")


# ---------------------------------------------------------------------------- the client
def test_the_libretranslatepy_client_gets_each_pair(three, ref):
    lt_api = pytest.importorskip("libretranslatepy")
    lt = lt_api.LibreTranslateAPI(three.url)
    for text in EN[:4]:
        assert lt.translate(text, "en", "fr") == ref["en-fr"].translate(text)
        assert lt.translate(text, "en", "de") == ref["en-de"].translate(text)
    for text in FR[:4]:
        assert lt.translate(text, "fr", "en") == ref["fr-en"].translate(text)
        assert lt.translate(text, "fr", "de") == pivoted(ref, [text])[0]  # no fr-de model
    assert lt.translate(EN[0], "en", "en") == EN[0]  # the same language: as given
    assert lt.languages() == three.get("/languages").json()
    (top, *_) = lt.detect("Le médecin lui a conseillé de se reposer quelques jours.")
    assert top["language"] == "fr" and 50 < top["confidence"] <= 100


def test_languages_lists_each_source_with_every_target_it_reaches(three):
    """As LibreTranslate lists them: every language (sources and targets), each with the
    targets it reaches, itself included, through one model or two."""
    assert three.get("/languages").json() == [
        {"code": "de", "name": "German", "targets": ["de"]},
        {"code": "en", "name": "English", "targets": ["de", "en", "fr"]},
        {"code": "fr", "name": "French", "targets": ["de", "en", "fr"]},
    ]


def test_translate_routes_by_source_and_target(three, ref):
    for pair in THREE:
        src, tgt = pair.split("-")
        texts = EN if src == "en" else FR
        r = three.post("/translate", json={"q": texts, "source": src, "target": tgt})
        assert r.status_code == 200, r.text
        assert r.json() == {"translatedText": ref[pair].translate(texts)}, pair
    r = three.post(
        "/translate", data={"q": EN[5], "source": "EN", "target": "Fr", "alternatives": "1"}
    )
    best, alt = ref["en-fr"].translate(EN[5], beam_size=2, n_best=2)
    assert r.json() == {"translatedText": best[0], "alternatives": [alt[0]]}


def test_a_pair_without_a_model_pivots_and_says_so(three, ref):
    r = three.post("/translate", json={"q": FR, "source": "fr", "target": "de"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": pivoted(ref, FR), "pivot": "en"}
    # the alternatives are the second model's, of the first model's best translation
    r = three.post(
        "/translate", json={"q": FR[3], "source": "fr", "target": "de", "alternatives": 2}
    )
    middle = ref["fr-en"].translate(FR[3])  # the first model's own beam: its best alone
    hyps = [t for t, _ in ref["en-de"].translate(middle, beam_size=3, n_best=3)]
    assert r.json() == {"translatedText": hyps[0], "alternatives": hyps[1:], "pivot": "en"}
    # a direct pair says nothing of a pivot; /attention shows one model, so it refuses two
    assert "pivot" not in three.post("/translate", json={**_en_fr(EN[0])}).json()
    r = three.post("/attention", json={"q": FR[0], "source": "fr", "target": "de"})
    assert r.status_code == 400 and "goes through en (two models)" in r.json()["error"]
    r = three.post("/attention", json={"q": EN[0], "source": "en", "target": "de"})
    assert r.status_code == 200 and r.json()["translatedText"] == ref["en-de"].translate(EN[0])


def _en_fr(q):
    return {"q": q, "source": "en", "target": "fr"}


def test_the_same_language_comes_back_as_given(three):
    r = three.post("/translate", json={"q": [EN[0], ""], "source": "en", "target": "en"})
    assert r.json() == {"translatedText": [EN[0], ""]}
    r = three.post("/translate", json={"q": "x", "source": "de", "target": "de", "alternatives": 1})
    assert r.json() == {"translatedText": "x", "alternatives": []}


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"source": "zh", "target": "fr"}, "source", "'zh' is not served; the languages served "
         "are de, en, fr"),
        ({"source": "en", "target": "ja"}, "target", "'ja' is not served; the languages served "
         "are de, en, fr"),
        ({"source": "de", "target": "fr"}, "target", "'fr' is not served from 'de': no model "
         "translates de to fr, directly or through another language; from de this server "
         "translates to de"),
        ({"target": "fr"}, "source", "missing; expected a language code or 'auto'"),
        ({"source": "en"}, "target", "missing; expected a language code; the languages served "
         "are de, en, fr"),
    ],
)  # fmt: skip
def test_an_unknown_pair_is_a_400_naming_what_is_served(three, fields, field, says):
    r = three.post("/translate", json={"q": "go .", **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"{field}: {says}"), r.json()
    r = three.post("/translate", json={"q": "go .", "source": 7, "target": "fr"})
    assert r.status_code == 422 and r.json()["error"].startswith("source: expected a language")


# ---------------------------------------------------------------------------- detection
@pytest.fixture(scope="module")
def six(folders):
    """A server of six models whose languages are en, fr, de, zh, ru and ar."""
    pytest.importorskip("py3langid")
    with live_app(create_app(registry(folders, tuple(MODELS)), ServeConfig())) as s:
        yield s


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_detect_names_the_language_of_real_sentences(six, lang):
    right = 0
    for text in SENTENCES[lang]:
        r = six.post("/detect", data={"q": text})  # a form, as libretranslatepy sends it
        assert r.status_code == 200, r.text
        found = r.json()
        assert found and all(set(d) == {"language", "confidence"} for d in found)
        confidences = [d["confidence"] for d in found]
        assert all(0 < c <= 100 for c in confidences) and confidences == sorted(
            confidences, reverse=True
        )
        assert {d["language"] for d in found} <= {"en", "fr", "de", "zh", "ru", "ar"}
        right += found[0]["language"] == lang
    assert right >= 19, f"{lang}: {right}/20"  # 95%


def test_auto_detects_the_source_with_a_real_confidence(six, ref):
    text = SENTENCES["fr"][14]
    r = six.post("/translate", json={"q": text, "source": "auto", "target": "en"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["translatedText"] == ref["fr-en"].translate(text)
    assert out["detectedLanguage"]["language"] == "fr"
    assert 80 < out["detectedLanguage"]["confidence"] <= 100
    # a list is judged together, one route for all, its language said for each text
    texts = SENTENCES["ru"][:3]
    out = six.post("/translate", json={"q": texts, "source": "auto", "target": "en"}).json()
    assert out["translatedText"] == ref["ru-en"].translate(texts)
    assert [d["language"] for d in out["detectedLanguage"]] == ["ru"] * 3
    # a language detected that reaches no model of the target: the 400 says which
    r = six.post("/translate", json={"q": SENTENCES["zh"][0], "source": "auto", "target": "fr"})
    assert r.status_code == 400 and "not served from 'zh'" in r.json()["error"]
    # nothing to judge: the text comes back as it is, confidence 0 (LibreTranslate's answer)
    out = six.post("/translate", json={"q": "42 !", "source": "auto", "target": "de"}).json()
    assert out == {
        "translatedText": "42 !",
        "detectedLanguage": {"language": "en", "confidence": 0.0},
    }
    assert six.post("/detect", json={"q": "1 + 1"}).json() == [
        {"language": "en", "confidence": 0.0}
    ]


def test_detect_judges_a_list_together_and_checks_its_input(six):
    found = six.post("/detect", json={"q": SENTENCES["de"][:5] + SENTENCES["en"][:1]}).json()
    assert found[0]["language"] == "de" and 50 < found[0]["confidence"] < 100
    r = six.post("/detect", json={})
    assert r.status_code == 422 and r.json()["error"].startswith("q: missing")
    assert six.get("/detect").status_code == 405


# ---------------------------------------------------------------------------- loading
def test_the_memory_cap_unloads_the_least_recently_used_and_reloads(folders, ref):
    reg = registry(folders)
    size = max(lane.folder.size for lane in reg.lanes)
    cfg = ServeConfig(memory_cap_mb=2.5 * size / 1e6, max_wait_ms=0)  # two models fit
    with live_app(create_app(reg, cfg)) as s:

        def loaded() -> set[str]:
            return {m["pair"] for m in s.get("/health").json()["models"] if m["loaded"]}

        assert loaded() == set()  # nothing is loaded before it is asked for
        for pair, texts, want in [
            ("en-fr", EN, {"en-fr"}),
            ("fr-en", FR, {"en-fr", "fr-en"}),
            ("en-fr", EN, {"en-fr", "fr-en"}),  # en-fr used again: fr-en is now the oldest
            ("en-de", EN, {"en-fr", "en-de"}),  # fr-en unloaded
            ("fr-en", FR, {"en-de", "fr-en"}),  # en-fr unloaded, fr-en loaded again
        ]:
            src, tgt = pair.split("-")
            r = s.post("/translate", json={"q": texts, "source": src, "target": tgt})
            assert r.json() == {"translatedText": ref[pair].translate(texts)}, pair
            assert loaded() == want, pair
        _, samples = parse(s.get("/metrics").text)
        assert value(samples, "qkv_model_loads_total", pair="fr-en") == 2
        assert value(samples, "qkv_model_unloads_total", pair="fr-en") == 1
        assert value(samples, "qkv_model_unloads_total", pair="en-fr") == 1
        assert value(samples, "qkv_model_loaded", pair="en-fr") == 0
        assert value(samples, "qkv_models_memory_bytes") <= 2.5 * size
        h = s.get("/health").json()
        assert (
            h["memory"]["cap_bytes"] == round(2.5 * size)
            and h["memory"]["loaded_bytes"] <= (h["memory"]["cap_bytes"])
        )
        # a pivot through two models under a cap of two: both legs load in turn
        r = s.post("/translate", json={"q": FR[:3], "source": "fr", "target": "de"})
        assert r.json()["translatedText"] == pivoted(ref, FR[:3])


def test_a_model_in_use_is_never_unloaded(folders):
    """A cap smaller than one model: each model loads alone, the one before it unloaded, and
    a lane held by a request stays."""
    reg = registry(folders)
    reg.attach(lambda lane: _NoBatcher())
    reg.set_memory_cap(1e-6)
    a, b, _ = reg.lanes

    async def go() -> None:
        await reg.acquire(a)
        await reg.acquire(b)  # a is held: over the cap, both stay
        assert a.translator is not None and b.translator is not None
        reg.release(a)
        await asyncio.sleep(0.05)  # the release brings the registry back under the cap
        assert a.translator is None and b.translator is not None
        reg.release(b)

    asyncio.run(go())
    assert (a.loads, a.unloads, b.loads) == (1, 1, 1)


class _NoBatcher:
    queue_depth = in_progress = 0

    def start(self) -> None: ...

    def stop(self) -> None: ...


# ---------------------------------------------------------------------------- metrics
def test_each_model_has_its_own_batcher_and_its_metrics(three, ref):
    before = parse(three.get("/metrics").text)[1]
    three.post("/translate", json={"q": EN[:4], "source": "en", "target": "de"})
    three.post("/translate", json={"q": FR[:2], "source": "fr", "target": "de"})
    types, after = parse(three.get("/metrics").text)
    assert types["qkv_model_batch_sentences"] == "histogram"
    lanes = {lane.pair: lane for lane in three.state.registry.lanes}
    assert lanes["en-de"].batcher is not None and lanes["fr-en"].batcher is not None
    assert lanes["en-de"].batcher is not lanes["fr-en"].batcher

    def grew(name: str, **labels: str) -> float:
        old = [
            v for n, ls, v in before if n == name and all(ls.get(k) == x for k, x in labels.items())
        ]
        return value(after, name, **labels) - (old[0] if old else 0.0)

    assert grew("qkv_model_batch_sentences_sum", pair="en-de") == 6  # 4 direct, 2 pivoted
    assert grew("qkv_model_batch_sentences_sum", pair="fr-en") == 2
    assert grew("qkv_pair_requests_total", source="fr", target="de", pivot="en") == 1
    assert grew("qkv_pair_sentences_total", source="en", target="de", pivot="") == 4
    assert value(after, "qkv_model_loaded", pair="en-de") == 1


def test_health_lists_every_model(three, folders):
    h = three.get("/health").json()
    assert h["status"] == "ok" and "model" not in h
    assert [m["pair"] for m in h["models"]] == list(THREE)
    for m in h["models"]:
        assert m["model_dir"] == folders[m["pair"]].name and m["engine"] == "qkv"
        assert m["bytes"] > 0


def test_openapi_documents_the_languages_and_detect(three):
    schema = three.get("/openapi.json").json()
    assert "/detect" in schema["paths"]
    source = schema["components"]["schemas"]["TranslateRequest"]["properties"]["source"]
    assert "default" not in source and "one of de, en, fr" in source["description"]
    assert "pivot" in schema["components"]["schemas"]["TranslateResponse"]["properties"]


# ---------------------------------------------------------------------------- the registry
def test_two_models_of_one_pair_and_languages_given_are_refused(folders, tmp_path):
    same = tiny_model_folder(tmp_path / "again", ("en", "fr"), seed=9)
    with pytest.raises(ValueError, match=r"model_dir: .*again' translates en to fr, as .*en-fr"):
        ModelRegistry.from_folders([inspect_folder(folders["en-fr"]), inspect_folder(same)])
    with pytest.raises(ValueError, match=r"source_lang: names the languages of one model"):
        create_app(registry(folders), ServeConfig(source_lang="en", target_lang="fr"))
    with pytest.raises(ValueError, match="memory_cap_mb: expected a number > 0"):
        ServeConfig(memory_cap_mb=0)
    unrecorded = tiny_model_folder(tmp_path / "old")
    with pytest.raises(ValueError, match="does not record the languages it translates"):
        inspect_folder(unrecorded)


def test_routes_prefer_a_pivot_through_english(folders):
    reg = ModelRegistry.from_folders([inspect_folder(folders[p]) for p in MODELS])
    route = reg.route("ru", "zh")
    assert route.pivot == "en" and [lane.pair for lane in route.legs] == ["ru-en", "en-zh"]
    assert reg.route("AR", "de").pivot == "en"
    assert reg.route("fr", "fr").legs == ()
    assert reg.targets("ru") == ["de", "en", "fr", "ru", "zh"]
    for a, b in itertools.product(reg.languages, repeat=2):  # every listed pair has a route
        if b in reg.targets(a):
            assert len(reg.route(a, b).legs) <= 2
        else:
            with pytest.raises(ValueError, match="target: "):
                reg.route(a, b)


@pytest.mark.slow
def test_ctranslate2_and_onnx_folders_serve_beside_a_qkv_one(folders, ref, tmp_path):
    """Every engine through one interface: fr-en as a bare CTranslate2 model, en-de as an ONNX
    export, en-fr as qkv's own folder; each answers as the engine does alone. The en-de ONNX
    export is of the unnudged tiny model, whose trace the run makes once for every test that
    exports it (tests/_onnx_cache.py)."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (dev)")
    pytest.importorskip("onnxruntime", reason="the onnx extra (dev)")
    from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
    from qkv.export.onnx import OnnxTranslator, export_onnx

    ct2 = export_ctranslate2(folders["fr-en"], tmp_path / "fr-en-ct2")  # its ctranslate2/
    onnx = export_onnx(tiny_model_folder(tmp_path / "en-de", ("en", "de")), tmp_path / "en-de-onnx")
    found = [inspect_folder(folders["en-fr"]), inspect_folder(ct2), inspect_folder(onnx)]
    assert [(f.pair, f.engine) for f in found] == [
        ("en-fr", "qkv"), ("fr-en", "ctranslate2"), ("en-de", "onnx")
    ]  # fmt: skip
    reg = ModelRegistry.from_folders(found)
    with live_app(create_app(reg, ServeConfig(max_wait_ms=0))) as s:
        r = s.post("/translate", json={"q": FR[:4], "source": "fr", "target": "en"})
        assert r.json()["translatedText"] == Ct2Translator(ct2, threads=1).translate(FR[:4])
        r = s.post("/translate", json={"q": EN[:4], "source": "en", "target": "de"})
        assert r.json()["translatedText"] == OnnxTranslator(onnx).translate(EN[:4])
        r = s.post("/translate", json={"q": EN[:4], "source": "en", "target": "fr"})
        assert r.json()["translatedText"] == ref["en-fr"].translate(EN[:4])
        engines = {m["pair"]: m["engine"] for m in s.get("/health").json()["models"]}
        assert engines == {"en-fr": "qkv", "fr-en": "ctranslate2", "en-de": "onnx"}
        # the qkv export with a CTranslate2 model inside runs on qkv unless --engine says
        both = export_ctranslate2(folders["en-zh"], tmp_path / "en-zh-ct2").parent
        assert inspect_folder(both).engine == "qkv"
        assert inspect_folder(both, engine="ctranslate2").engine == "ctranslate2"


# ---------------------------------------------------------------------------- the command
def one_line_error(capsys, flag: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"qkv serve: error: {flag}: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def bad(folders, tmp_path) -> dict[str, list[str]]:
    """argv tails that must fail, by name."""
    a, b = str(folders["en-fr"]), str(folders["fr-en"])
    (tmp_path / "a-file").write_text("not a model")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken" / "m").mkdir(parents=True)
    (tmp_path / "broken" / "m" / "model.json").write_text("{")
    old = tiny_model_folder(tmp_path / "old")
    again = tiny_model_folder(tmp_path / "again", ("en", "fr"), seed=9)
    return {
        "missing": ["--model-dir", a, "--model-dir", str(tmp_path / "none")],
        "file": ["--model-dir", a, "--model-dir", str(tmp_path / "a-file")],
        "unrecorded": ["--model-dir", a, "--model-dir", str(old)],
        "same pair": ["--model-dir", a, "--model-dir", str(again)],
        "no ct2": ["--model-dir", a, "--model-dir", b, "--engine", "ctranslate2"],
        "models-dir missing": ["--models-dir", str(tmp_path / "none")],
        "models-dir empty": ["--models-dir", str(tmp_path / "empty")],
        "models-dir broken": ["--models-dir", str(tmp_path / "broken")],
        "languages": ["--model-dir", a, "--model-dir", b, "--source-lang", "en"],
        "cap": ["--model-dir", a, "--model-dir", b, "--memory-cap-mb", "0"],
        "none": [],
    }


@pytest.mark.parametrize(
    ("case", "flag", "says"),
    [
        ("missing", "--model-dir", "none' does not exist"),
        ("file", "--model-dir", "a-file' is a file; expected a model folder"),
        ("unrecorded", "--model-dir", "old' does not record the languages it translates"),
        ("same pair", "--model-dir", "again' translates en to fr, as "),
        ("no ct2", "--model-dir", "en-fr' holds no CTranslate2 model"),
        ("models-dir missing", "--models-dir", "none' does not exist"),
        ("models-dir empty", "--models-dir", "empty' holds no model folder"),
        ("models-dir broken", "--models-dir", "m' "),
        ("languages", "--source-lang", "names the languages of one model"),
        ("cap", "--memory-cap-mb", "expected a number > 0"),
        ("none", "--model-dir", "expected a model folder (or --models-dir DIR)"),
    ],
)
def test_bad_model_folders_are_one_line_naming_the_flag(bad, capsys, case, flag, says):
    from qkv.cli import main

    assert main(["serve", *bad[case], "--quiet"]) == 2
    assert says in one_line_error(capsys, flag)


def test_qkv_serve_models_dir_serves_every_pair(folders, ref, tmp_path):
    """A real process: ``qkv serve --models-dir`` with the three models, the client answered
    for a pivoted pair, then SIGTERM and exit 0."""
    import json
    import shutil
    import signal
    import urllib.request

    from test_serve_cli import post, start_process

    root = tmp_path / "models"
    for pair in THREE:
        shutil.copytree(folders[pair], root / pair)
    (root / "notes").mkdir()  # a folder that holds no model is passed over
    proc, url = start_process("--models-dir", str(root), "--memory-cap-mb", "1")
    try:
        with urllib.request.urlopen(url + "languages", timeout=30) as r:
            assert [d["code"] for d in json.loads(r.read())] == ["de", "en", "fr"]
        status, out = post(url + "translate", {"q": FR[:2], "source": "fr", "target": "de"})
        assert (status, out) == (200, {"translatedText": pivoted(ref, FR[:2]), "pivot": "en"})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err and "qkv serve: stopped" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
