"""qkv.data.languages: the code table, checks, names, and detection with py3langid."""

from __future__ import annotations

import itertools

import pytest

from qkv._deps import MissingDependency
from qkv._errors import SettingError
from qkv.data import languages as L

#: 20 real sentences per language (everyday sentences and software messages, as a server meets)
SENTENCES = {
    "en": [
        "The cat is sleeping on the chair.", "Save the document before closing it.",
        "Where is the train station?", "I would like a cup of coffee, please.",
        "The meeting has been moved to Thursday afternoon.", "Insert or edit a link",
        "Could you send me the report by tomorrow?", "My brother lives in a small village.",
        "Click the button to start the download.", "It rained all day yesterday.",
        "Please enter your password again.", "The museum is closed on Mondays.",
        "We need more time to finish the project.", "She reads a book every week.",
        "The file could not be opened.", "How much does this jacket cost?",
        "Turn left at the next traffic light.", "The children are playing in the garden.",
        "This setting applies to all users.", "I forgot my umbrella at the office.",
    ],
    "fr": [
        "Le chat dort sur la chaise.", "Enregistrez le document avant de le fermer.",
        "Où est la gare ?", "Je voudrais une tasse de café, s'il vous plaît.",
        "La réunion a été déplacée à jeudi après-midi.", "Insérer ou modifier un lien",
        "Pourriez-vous m'envoyer le rapport d'ici demain ?", "Mon frère habite dans un petit village.",
        "Cliquez sur le bouton pour lancer le téléchargement.", "Il a plu toute la journée hier.",
        "Veuillez saisir à nouveau votre mot de passe.", "Le musée est fermé le lundi.",
        "Nous avons besoin de plus de temps pour finir le projet.", "Elle lit un livre chaque semaine.",
        "Le fichier n'a pas pu être ouvert.", "Combien coûte cette veste ?",
        "Tournez à gauche au prochain feu.", "Les enfants jouent dans le jardin.",
        "Ce paramètre s'applique à tous les utilisateurs.", "J'ai oublié mon parapluie au bureau.",
    ],
    "de": [
        "Die Katze schläft auf dem Stuhl.", "Speichern Sie das Dokument, bevor Sie es schließen.",
        "Wo ist der Bahnhof?", "Ich hätte gern eine Tasse Kaffee, bitte.",
        "Die Besprechung wurde auf Donnerstagnachmittag verschoben.", "Link einfügen oder bearbeiten",
        "Könnten Sie mir den Bericht bis morgen schicken?", "Mein Bruder wohnt in einem kleinen Dorf.",
        "Klicken Sie auf die Schaltfläche, um den Download zu starten.", "Gestern hat es den ganzen Tag geregnet.",
        "Bitte geben Sie Ihr Passwort erneut ein.", "Das Museum ist montags geschlossen.",
        "Wir brauchen mehr Zeit, um das Projekt abzuschließen.", "Sie liest jede Woche ein Buch.",
        "Die Datei konnte nicht geöffnet werden.", "Wie viel kostet diese Jacke?",
        "Biegen Sie an der nächsten Ampel links ab.", "Die Kinder spielen im Garten.",
        "Diese Einstellung gilt für alle Benutzer.", "Ich habe meinen Regenschirm im Büro vergessen.",
    ],
    "zh": [
        "猫在椅子上睡觉。", "关闭之前请先保存文档。", "请问火车站在哪里？", "我想要一杯咖啡，谢谢。",
        "会议改到星期四下午了。", "插入或编辑链接", "你能在明天之前把报告发给我吗？",
        "我哥哥住在一个小村子里。", "点击按钮开始下载。", "昨天下了一整天的雨。",
        "请再次输入您的密码。", "博物馆星期一闭馆。", "我们需要更多时间来完成这个项目。",
        "她每个星期读一本书。", "无法打开该文件。", "这件夹克多少钱？", "在下一个红绿灯处左转。",
        "孩子们在花园里玩。", "此设置适用于所有用户。", "我把雨伞忘在办公室了。",
    ],
}  # fmt: skip


def test_the_table_holds_every_iso_639_1_code():
    assert len(L.LANGUAGES) == 183
    assert all(len(c) == 2 and c.islower() for c in L.LANGUAGES)
    assert L.LANGUAGES["zh"] == "Chinese" and L.LANGUAGES["de"] == "German"
    assert sorted(L.RICH_CHARACTER_SETS) == ["ja", "ko", "zh"]
    assert set(L.LANGUAGES) >= L.CASELESS and L.RICH_CHARACTER_SETS <= L.CASELESS


@pytest.mark.parametrize(
    "given, canonical",
    [("en", "en"), ("FR", "fr"), ("zh-cn", "zh-CN"), ("pt_br", "pt-BR"), ("zh-hans", "zh-Hans"),
     ("zh-Hant-TW", "zh-Hant-TW"), ("es-419", "es-419"), (" de ", "de")],
)  # fmt: skip
def test_check_language_gives_the_canonical_tag(given, canonical):
    assert L.check_language(given) == canonical


@pytest.mark.parametrize(
    "bad, hint",
    [("english", "en"), ("fra", "fr"), ("xx", None), ("", None), ("en-", None), (3, None)],
)
def test_check_language_refuses_naming_the_argument(bad, hint):
    with pytest.raises(SettingError) as e:
        L.check_language(bad, "src_lang")
    assert e.value.key == "src_lang" and str(e.value).startswith("src_lang: ")
    assert isinstance(e.value, ValueError)
    if hint:
        assert f"did you mean {hint!r}" in str(e.value)


def test_names_codes_and_base_languages():
    assert L.language_name("de") == "German"
    assert L.language_name("pt-BR") == "Portuguese (BR)"
    assert L.base_language("zh-Hans-CN") == "zh"
    for word, code in [("French", "fr"), ("CHINESE", "zh"), ("eng", "en"), ("deu", "de"),
                       ("ger", "de"), ("cmn", "zh"), ("en_US", "en-US"), ("Farsi", "fa"),
                       ("src", None), ("text", None), ("", None), (None, None)]:  # fmt: skip
        assert L.language_code(word) == code, word


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_detection_names_real_sentences(lang):
    pytest.importorskip("py3langid")
    found = L.detect_languages(SENTENCES[lang])
    right = sum(code == lang for code, _ in found)
    assert right >= 19, [(s, f) for s, f in zip(SENTENCES[lang], found) if f[0] != lang]
    assert all(0.0 <= p <= 1.0 for _, p in found)
    code, confidence = L.detect_language(SENTENCES[lang])
    assert code == lang and confidence > 0.8


def test_detection_among_candidates_and_of_text_without_letters():
    pytest.importorskip("py3langid")
    code, p = L.detect_language("猫在椅子上睡觉。", candidates=["en", "fr", "zh-CN"])
    assert code == "zh" and 0.5 < p <= 1.0
    assert L.detect_languages(["", "123 ...", "Bonjour tout le monde"], candidates=["en", "fr"])[
        :2
    ] == [("", 0.0), ("", 0.0)]
    assert L.detect_language(["", "42"]) == ("", 0.0)
    assert "zh" in L.detectable_languages() and "fr" in L.detectable_languages()
    with pytest.raises(SettingError, match="candidates"):
        L.detect_language("x", candidates=[])
    with pytest.raises(TypeError, match="texts"):
        L.detect_languages("one string")


def test_rank_languages_gives_every_candidate_most_likely_first():
    pytest.importorskip("py3langid")
    text = "Der Zug fährt um acht Uhr ab."
    ranked = L.rank_languages(text, candidates=["en", "fr", "de-AT"])
    assert ranked[0][0] == "de" and {c for c, _ in ranked} <= {"en", "fr", "de"}
    assert abs(sum(p for _, p in ranked) - 1.0) < 1e-9
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(ranked))
    assert ranked[0] == L.detect_languages([text], candidates=["en", "fr", "de"])[0]
    assert L.rank_languages("12 + 7 = 19") == []
    with pytest.raises(TypeError, match="text"):
        L.rank_languages(["a list"])  # type: ignore[arg-type]


def test_each_texts_detection_is_the_first_of_its_ranking():
    """detect_languages takes each text's most likely language without ranking the rest: the
    same answer as rank_languages' first, over every language and over candidates, varieties
    summed (Egyptian and Moroccan Arabic count as Arabic)."""
    pytest.importorskip("py3langid")
    texts = [s for lang in sorted(SENTENCES) for s in SENTENCES[lang][:4]]
    texts += ["مرحبا، كيف حالك اليوم؟", "إزيك يا صاحبي؟ عامل إيه؟", "Moin, wie geiht di dat?", "ok"]
    for candidates in (None, ["en", "de", "ar"], ["fr"]):
        ranked = [L.rank_languages(t, candidates=candidates)[0] for t in texts]
        assert L.detect_languages(texts, candidates=candidates) == ranked


def test_detection_without_the_package_says_which_extra(monkeypatch):
    import qkv._deps as deps

    real = deps._installed
    monkeypatch.setattr(deps, "_installed", lambda m: m != "py3langid" and real(m))
    L._identifier.cache_clear()
    try:
        with pytest.raises(MissingDependency, match=r"py3langid: pip install 'qkv\[langid\]'"):
            L.detect_language("Bonjour")
    finally:
        L._identifier.cache_clear()
    # the table, the checks and the names need nothing
    assert L.check_language("fr") == "fr"
